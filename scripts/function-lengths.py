#!/usr/bin/env python3
"""Lists the C++ functions longer than a limit in the files given, and exits 1 when any is.

A function's length counts its lines from the first line of its declaration (a `template <...>`
line above the signature included) to its closing brace, both included.

This is a heuristic on the code's layout, not a C++ parser: comments, string, character and raw
string literals are blanked out, then braces are matched. A brace opened at namespace or class scope
whose text since the last `;`, `{` or `}` has a `(` (and is not a class, struct, union or enum
header, nor an initialiser after `=`) opens a function: a member function, a free function, or a
lambda assigned at namespace scope. Everything inside a function (lambdas, local classes) counts
toward that function. Braces inside a header's parentheses (a default argument `Set s = {}`) and
those of a constructor's member initialisers (`x_{y}`) are part of the header, skipped.
Preprocessor lines are ignored. Macros that expand to braces, or code laid out otherwise than this
project's sources, can fool it.

Usage: scripts/function-lengths.py [--limit 60] [--all] FILE...
  --limit N  the most lines a function may have (default 60)
  --all      list every function with its length, not only those over the limit
"""
import argparse
import re
import sys

ACCESS = re.compile(r"^\s*(?:public|private|protected)\s*:(?!:)")
# `= [captures]` then its parameters, a specifier, a trailing return type or the body's brace.
LAMBDA = re.compile(r"=\s*\[[^\]]*\]\s*(?:\(|->|mutable\b|constexpr\b|noexcept\b|$)")
IDENT = re.compile(r"[A-Za-z_~][A-Za-z0-9_]*(?:::[A-Za-z_~][A-Za-z0-9_]*)*")


def blank(text):
    """`text` with comments, literals and preprocessor lines replaced by spaces, newlines kept."""
    out = []
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and not (text[i] == "\n" and text[i - 1] != "\\"):
                out.append("\n" if text[i] == "\n" else " ")
                i += 1
            continue
        if c == "\n":
            line_start = True
            out.append(c)
            i += 1
            continue
        if not c.isspace():
            line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                out.append(" ")
                i += 1
            continue
        if text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.extend("\n" if ch == "\n" else " " for ch in text[i:end])
            i = end
            continue
        raw = re.match(r'(?:u8|u|U|L)?R"([^()\\ ]{0,16})\(', text[i:i + 24])
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            close = ")" + raw.group(1) + '"'
            end = text.find(close, i + raw.end())
            end = n if end < 0 else end + len(close)
            out.extend("\n" if ch == "\n" else " " for ch in text[i:end])
            out[-1] = '"'  # keeps a token where the literal was
            i = end
            continue
        if c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000: a separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.extend("\n" if ch == "\n" else " " for ch in text[i:j + 1])
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def without_template_heads(header):
    """`header` less each `template <...>` (its parameters may say class)."""
    while True:
        match = re.search(r"\btemplate\s*<", header)
        if not match:
            return header
        depth, j = 0, match.end() - 1
        while j < len(header):
            depth += {"<": 1, ">": -1}.get(header[j], 0)
            if depth == 0:
                break
            j += 1
        header = header[:match.start()] + " " + header[j + 1:]


def header_kind(header):
    """What a brace opened after `header` (the text since the last ;, { or }) starts."""
    header = without_template_heads(header)
    words = header.split()
    if not words:
        return "block"
    if "namespace" in words or re.search(r'\bextern\s+"', header):
        return "namespace"
    paren = header.find("(")
    before = header if paren < 0 else header[:paren]
    if re.search(r"\benum\b", before):
        return "data"
    if re.search(r"\b(?:class|struct|union)\b", before) and "=" not in before:
        return "class"
    if paren >= 0 and "=" not in re.sub(r"\boperator\s*[^\s(]*", "", before):
        return "function"
    if LAMBDA.search(header):  # a lambda at namespace scope
        return "function"
    return "data"


def function_name(header):
    lambda_ = LAMBDA.search(header)
    if lambda_:
        header = header[:lambda_.start()]  # its variable's name
    paren = header.find("(")
    match = None
    for match in IDENT.finditer(header[:paren] if paren >= 0 else header):
        pass
    operator = re.search(r"\boperator\s*(\(\)|[^\s(]+)", header)
    if operator:
        return "operator" + operator.group(1)
    return match.group(0) if match else "?"


def past_braces(code, i):
    """The index after the `}` that closes the `{` at `i`."""
    depth = 0
    while i < len(code):
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        if depth == 0:
            break
        i += 1
    return i + 1


def functions(text):
    """(name, first line, last line) of each function in `text`."""
    code = blank(text)
    found = []
    scopes = []  # "namespace", "class", "data", "block", or ("function", name, line)
    header_start = 0
    i = 0
    while i < len(code):
        c = code[i]
        outer = not scopes or scopes[-1] in ("namespace", "class")
        if c == "{":
            header = code[header_start:i]
            access = ACCESS.match(header)
            if access:
                header_start += access.end()
                header = code[header_start:i]
            glued = code[i - 1].isalnum() or code[i - 1] == "_"
            initialiser = glued and re.search(r"\)\s*:", header)  # x_{y}
            in_parens = header.count("(") > header.count(")")  # f(Set s = {}), x_(T{y})
            if outer and (initialiser or in_parens):
                i = past_braces(code, i)  # part of the function's header
                continue
            kind = header_kind(header) if outer else "block"
            if kind == "function":
                offset = len(header) - len(header.lstrip())
                line = code.count("\n", 0, header_start + offset) + 1
                scopes.append(("function", function_name(header), line))
            else:
                scopes.append(kind)
            header_start = i + 1
        elif c == "}":
            scope = scopes.pop() if scopes else "block"
            if isinstance(scope, tuple):
                found.append((scope[1], scope[2], code.count("\n", 0, i) + 1))
            header_start = i + 1
        elif c == ";" and outer:
            header_start = i + 1
        elif c == ":" and outer and ACCESS.match(code[header_start:i + 1]):
            header_start = i + 1
        i += 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=60)
    parser.add_argument("--all", action="store_true")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    over = []
    for path in args.files:
        with open(path, encoding="utf-8") as f:
            for name, first, last in functions(f.read()):
                length = last - first + 1
                if length > args.limit:
                    over.append((path, first, name, length))
                elif args.all:
                    print(f"{path}:{first}: {name}: {length} lines")
    for path, first, name, length in sorted(over, key=lambda o: -o[3]):
        print(f"{path}:{first}: {name}: {length} lines (over {args.limit})")
    if over:
        print(f"{len(over)} function(s) longer than {args.limit} lines", file=sys.stderr)
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
