#!/usr/bin/env python3
"""Every C++ source of the project is laid out as .clang-format says, and no line of it passes 100
columns. Run by the suite (ctest sources_are_formatted); fix with
  clang-format -i $(git ls-files '*.cpp' '*.hpp')

Usage: scripts/check-format.py [--clang-format PATH]
"""
import argparse
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("include", "src", "tests", "bench", "fuzz", "python", "web")
LIMIT = 100


def sources():
    """The C++ files under FOLDERS (git's list where there is one: a build folder's are not ours)."""
    try:
        listed = subprocess.run(["git", "ls-files", "*.cpp", "*.hpp", "*.h"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout.split()
        return sorted(f for f in listed if f.split("/")[0] in FOLDERS)
    except (OSError, subprocess.CalledProcessError):
        found = []
        for folder in FOLDERS:
            for base, _, names in os.walk(os.path.join(ROOT, folder)):
                found += [os.path.relpath(os.path.join(base, n), ROOT) for n in names
                          if n.endswith((".cpp", ".hpp", ".h"))]
        return sorted(found)


def long_lines(files):
    for f in files:
        with open(os.path.join(ROOT, f), encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                if len(line.rstrip("\n")) > LIMIT:
                    yield f"{f}:{number}: {len(line.rstrip())} columns (at most {LIMIT})"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clang-format", default=shutil.which("clang-format"))
    a = ap.parse_args()
    if not a.clang_format or a.clang_format.endswith("NOTFOUND"):
        sys.exit("check-format: clang-format is not installed (the README's first command installs it)")
    files = sources()
    problems = list(long_lines(files))
    run = subprocess.run([a.clang_format, "--dry-run", "--Werror"] + files, cwd=ROOT,
                         capture_output=True, text=True)
    unformatted = sorted({line.split(":")[0] for line in run.stderr.splitlines() if ": error:" in line})
    problems += [f"{f}: not as .clang-format lays it out" for f in unformatted]
    if run.returncode != 0 and not unformatted:
        problems.append(f"clang-format failed: {run.stderr.strip()[:500]}")
    for p in problems:
        print(p)
    print(f"check-format: {len(files)} files, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
