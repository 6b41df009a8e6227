#!/usr/bin/env python3
"""Re-runs every `$ command` in the ```console blocks of README.md and docs/*.md and writes its real
output below it, and refreshes each ```text block that follows a `<!-- output of: COMMAND -->` line
with COMMAND's output (less a last line of timing in parentheses).

The CLI test "every command in the README and the docs prints what the page shows" fails until this
is run after a change to what the program prints. Usage: scripts/update-readme-examples.py [BUILD_DIR]
"""
import glob
import os
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build"))
env = dict(os.environ, PATH=build + os.pathsep + os.environ["PATH"])


def run(command, page):
    done = subprocess.run(command, shell=True, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{page}: {command!r} failed ({done.returncode}): "
                 f"{done.stderr.strip() or done.stdout[-500:]}")
    return done.stdout


def refresh(text, page):
    out, in_console, in_generated = [], False, False
    for line in text.split("\n"):
        if in_generated:
            if line == "```":
                in_generated = False
                out.append(line)
            continue
        if line.startswith("```text") and out and out[-1].startswith("<!-- output of: "):
            command = out[-1][len("<!-- output of: "):].rstrip(" ->")
            lines = run(command, page).rstrip("\n").split("\n")
            if lines and lines[-1].startswith("(") and lines[-1].endswith(" s)"):
                lines.pop()
            out.append(line)
            out.extend(lines)
            in_generated = True
            continue
        if line.startswith("```"):
            in_console = not in_console and line == "```console"
            out.append(line)
        elif in_console and line.startswith("$ "):
            output = run(line[2:], page)
            out.append(line)
            out.extend(output.rstrip("\n").split("\n") if output else [])
        elif not in_console:
            out.append(line)
    return "\n".join(out)


pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
for path in pages:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    new = refresh(text, os.path.relpath(path, root))
    if new != text:
        with open(path, "w", encoding="utf-8") as f:
            f.write(new)
        print(f"updated {os.path.relpath(path, root)}")
