#!/usr/bin/env python3
"""Re-runs every `$ command` in README.md's ```console blocks and writes its real output below it,
and refreshes each ```text block that follows a `<!-- output of: COMMAND -->` line with COMMAND's
output (less a last line of timing in parentheses).

The CLI test "every command in the README prints what the README shows" fails until this is run
after a change to what the program prints. Usage: scripts/update-readme-examples.py [BUILD_DIR]
"""
import os
import subprocess
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build"))
env = dict(os.environ, PATH=build + os.pathsep + os.environ["PATH"])
path = os.path.join(root, "README.md")

out, in_console, in_generated = [], False, False
for line in open(path, encoding="utf-8").read().split("\n"):
    if in_generated:
        if line == "```":
            in_generated = False
            out.append(line)
        continue
    if line.startswith("```text") and out and out[-1].startswith("<!-- output of: "):
        command = out[-1][len("<!-- output of: "):].rstrip(" ->")
        run = subprocess.run(command, shell=True, cwd=root, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{command!r} failed ({run.returncode}): {run.stderr.strip() or run.stdout[-500:]}")
        lines = run.stdout.rstrip("\n").split("\n")
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
        run = subprocess.run(line[2:], shell=True, cwd=root, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{line[2:]!r} failed ({run.returncode}): {run.stderr.strip()}")
        out.append(line)
        out.extend(run.stdout.rstrip("\n").split("\n") if run.stdout else [])
    elif not in_console:
        out.append(line)
open(path, "w", encoding="utf-8").write("\n".join(out))
