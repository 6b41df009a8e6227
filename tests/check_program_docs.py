"""The man page and the shell completions (written by memcalc_docs) against the program itself.

Usage: check_program_docs.py MEMCALC DOCS_DIR. The man page must name every option each command's
--help lists, and groff must render it without a warning; bash, with the completion sourced, must
offer each command's options and the values of enumerated options (the catalogues' names as the
program lists them); zsh must read its completion, where zsh is installed.
"""
import json
import os
import re
import shutil
import subprocess
import sys

PROGRAM, DOCS = sys.argv[1], sys.argv[2]
OPTION = re.compile(r"^  (-[\w-]+(?:,-[\w-]+)*)", re.M)  # --help's option lines


def run(*args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, check=True, **kwargs).stdout


def commands():
    """Each command's name ("" for the estimate) and the option names its --help lists."""
    listed = run(PROGRAM, "--help").split("\nSubcommands:\n")[1].split("\n\n")[0]
    names = [""] + re.findall(r"^  ([a-z][\w-]+)\s", listed, re.M)
    found = {}
    for name in names:
        text = run(PROGRAM, *([name] if name else []), "--help")
        text = text.split("\nSubcommands:\n")[0]
        found[name] = sorted({o for m in OPTION.findall(text) for o in m.split(",")})
        assert found[name], f"no options read from 'memcalc {name} --help'"
    return found


def check_man_page(found):
    page = os.path.join(DOCS, "memcalc.1")
    render = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", page], capture_output=True,
                            text=True)
    assert render.returncode == 0 and not render.stderr, f"groff warns: {render.stderr}"
    text = open(page, encoding="utf-8").read().replace("\\-", "-")
    for section in ("NAME", "SYNOPSIS", "OPTIONS", "COMMANDS", "EXAMPLES", "EXIT STATUS"):
        assert f".SH {section}\n" in text, section
    for name, options in found.items():
        if name:
            assert f'.SS "memcalc {name} [OPTION...]"' in text, name
        for option in options:
            assert re.search(rf"\\fB{re.escape(option)}\\fR", text), f"{name} {option}"
    assert "memcalc --preset llama-7b --seq 4096 --recompute selective" in text
    assert re.search(r"\.SH EXIT STATUS\n0 on success", text)


def complete(line):
    """What bash offers for `line` (the cursor at its end), the completion sourced."""
    script = (f"source {DOCS}/memcalc.bash\n"
              f"COMP_LINE={json.dumps(line)}; read -ra COMP_WORDS <<< \"$COMP_LINE\"\n"
              "[[ $COMP_LINE == *' ' ]] && COMP_WORDS+=('')\n"
              "COMP_CWORD=$((${#COMP_WORDS[@]} - 1))\n"
              "_memcalc; printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    return run("bash", "--norc", "--noprofile", "-c", script).split()


def names(catalogue):
    return [row["name"] for row in json.loads(run(PROGRAM, catalogue, "--format", "json"))]


def check_bash(found):
    assert "--preset" in complete("memcalc --pre")
    assert "llama-7b" in complete("memcalc --preset ll")
    assert set(complete("memcalc --preset ")) == set(names("presets"))
    assert set(complete("memcalc fit --recipe ")) == set(names("recipes"))
    assert set(complete("memcalc --profile ")) == set(names("profiles"))
    assert set(complete("memcalc serve --gpu ")) == set(names("gpus"))
    # --preset=ll: bash splits it at the '=' (COMP_WORDBREAKS)
    assert "llama-7b" in complete("memcalc --preset = ll")
    assert complete("memcalc --recompute none,sel") == ["none,selective"]
    assert complete("memcalc --format j") == ["json"]
    assert "fit" in complete("memcalc f") and "plan" not in complete("memcalc f")
    assert "int4" in complete("memcalc serve --weights ")
    assert set(complete("memcalc --loss ")) >= {"fp32", "bf16", "fused"}
    assert complete("memcalc --seq ") == []
    for name, options in found.items():
        offered = set(complete(f"memcalc {name} -"))
        assert set(options) <= offered, f"{name}: {set(options) - offered}"


def check_zsh():
    zsh = shutil.which("zsh")
    if not zsh:
        print("zsh not installed: its completion's check skipped")
        return
    completion = os.path.join(DOCS, "_memcalc")
    run(zsh, "-n", completion)
    text = open(completion, encoding="utf-8").read()
    assert text.startswith("#compdef memcalc\n")
    assert re.search(r"'--preset\[[^]]*\]:name:\([^)]*\bllama-7b\b", text)
    # what _memcalc passes to _arguments: the command's options, the commands at the first word
    stub = f"_arguments() {{ print -rl -- \"$@\" }}; words=(%s); CURRENT=%d; source {completion}"
    specs = run(zsh, "-f", "-c", stub % ("memcalc fit --pre", 3)).splitlines()
    assert any(s.startswith("--multiple-of[") for s in specs), "fit's options"
    assert any(re.match(r"--recompute\[.*:_values -s , mode none selective", s) for s in specs)
    specs = run(zsh, "-f", "-c", stub % ("memcalc ''", 2)).splitlines()
    assert any(s.startswith("1:command:((fit") for s in specs), "the commands"
    assert not any(s.startswith("--multiple-of[") for s in specs), "the estimate's options"


def main():
    found = commands()
    check_man_page(found)
    check_bash(found)
    check_zsh()
    print(f"man page and completions cover {sum(len(o) for o in found.values())} options "
          f"of {len(found)} commands")


if __name__ == "__main__":
    main()
