#!/usr/bin/env python3
"""Checks scripts/function-lengths.py on fixtures: each `// expect: NAME LINES` comment in a fixture
names the function that starts on the next line and the length the script must print for it, and
the script must print no function that no comment names. Then checks --limit: the functions over it
are listed, longest first, and the script exits 1.

Usage: tests/check_function_lengths.py SCRIPT FIXTURE...
"""
import re
import subprocess
import sys

EXPECT = re.compile(r"^\s*// expect: (\S+) (\d+)\s*$")
LISTED = re.compile(r"^(.*):(\d+): (\S+): (\d+) lines( \(over \d+\))?$")


def expected(path):
    """{(path, first line): (name, lines)} from the fixture's comments."""
    found = {}
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            match = EXPECT.match(line)
            if match:
                found[(path, number + 1)] = (match.group(1), int(match.group(2)))
    return found


def listed(script, args):
    run = subprocess.run([sys.executable, script] + args, capture_output=True, text=True)
    rows = []
    for line in run.stdout.splitlines():
        match = LISTED.match(line)
        if not match:
            raise SystemExit(f"unexpected output line: {line!r}")
        rows.append((match.group(1), int(match.group(2)), match.group(3), int(match.group(4)),
                     bool(match.group(5))))
    return run.returncode, rows


def main():
    script, fixtures = sys.argv[1], sys.argv[2:]
    want = {}
    for path in fixtures:
        want.update(expected(path))
    problems = []
    code, rows = listed(script, ["--all", "--limit", "1000"] + fixtures)
    if code != 0:
        problems.append(f"--limit 1000 exited {code}, not 0")
    got = {(path, first): (name, lines) for path, first, name, lines, _ in rows}
    if len(got) != len(rows):
        problems.append(f"two functions printed at one line: {rows}")
    for place in sorted(set(want) | set(got)):
        if want.get(place) != got.get(place):
            problems.append(f"{place[0]}:{place[1]}: expected {want.get(place)}, "
                            f"the script printed {got.get(place)}")
    # Over a limit: those longer than it alone, longest first, and exit status 1.
    limit = 5
    code, rows = listed(script, ["--limit", str(limit)] + fixtures)
    over = sorted(((lines, name) for name, lines in want.values() if lines > limit),
                  key=lambda o: -o[0])
    if code != 1 or [(lines, name) for _, _, name, lines, flagged in rows if flagged] != over or \
            len(rows) != len(over):
        problems.append(f"--limit {limit}: exit {code}, printed {rows}; expected exit 1 and {over}")
    for p in problems:
        print(p)
    print(f"check_function_lengths: {len(want)} functions expected, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
