#!/usr/bin/env python3
"""The C++ functions longer than a limit, counted in lines from the signature to the
closing brace (a lambda counts in the function that holds it).

    scripts/function_lengths.py [--max-lines 100] [--known FILE] [PATH ...]

PATH: files or folders (default: the libraries, the program and the native module).
Prints one line per function over the limit, longest first ("lines  file:line  name").
With --known, FILE lists the functions still over the limit ("file name lines" per
line, `#` comments), waiting to be split: the exit status is 1 when a function over
the limit is not listed, a listed one grew, or a listed one is no longer over the limit
(take it off the list); 0 otherwise. Without --known, 1 when any function is over.
Run as the test `style.function_lengths` with scripts/long_functions.txt.

The scanner reads the text, not the grammar: comments, string and character literals
are blanked first; then, in namespace and class scope, a `{` opens a function body when
the text before it (since the previous `;`, `{` or `}` of that scope) holds a parameter
list and does not open a namespace, class, struct, union or enum, nor an initializer
(`= {`); braces inside parentheses (a default argument `= {}`) are skipped. Constructor
initializer lists (`: a_(x), b_{y}`) are skipped to the body's brace.
The project's code is clang-formatted, which keeps these shapes regular.
"""

import argparse
import os
import re
import sys

ROOTS = ("common", "balance", "rollout", "scheduler", "wire", "app", "python/native")
SUFFIXES = (".cc", ".h", ".cpp", ".hpp")
SCOPES = re.compile(r"\b(namespace|class|struct|union|enum)\b")
NAME = re.compile(
    r"((?:[A-Za-z_~][\w]*::)*(?:operator\s*\(\s*\)|operator\s*[^\s(]+|~?[A-Za-z_]\w*))\s*\($")


def blank(text):
    """`text` with comments and literals replaced by spaces (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'" and not (c == "'" and i > 0 and text[i - 1].isalnum()):
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else " " * (j - i))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def matching(text, i):
    """The index just past the brace matching the `{` at `i`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def strip_template(header):
    """`header` without its leading `template <...>` parameter lists."""
    while header.startswith("template"):
        rest = header[len("template"):].lstrip()
        if not rest.startswith("<"):
            return header
        depth = 0
        for k, c in enumerate(rest):
            depth += {"<": 1, ">": -1}.get(c, 0)
            if depth == 0:
                header = rest[k + 1:].lstrip()
                break
        else:
            return header
    return header


def signature_name(header):
    """The function's name when `header` (the text before a `{`) is a function's
    signature, else None."""
    h = strip_template(header.strip())
    if not h or SCOPES.search(h.split("(")[0]) or h.endswith("=") or "(" not in h:
        return None
    if re.match(r"(if|for|while|switch|catch|do|else|return)\b", h):
        return None
    call = re.search(r"operator\s*\(\s*\)", h)  # operator(): its name holds "()"
    skip = call.end() if call else 0
    depth, open_at = 0, -1
    for k, c in enumerate(h[skip:], skip):  # the first top-level parameter list
        if c == "(":
            if depth == 0 and open_at < 0:
                open_at = k
            depth += 1
        elif c == ")":
            depth -= 1
    if open_at < 0 or depth != 0:
        return None
    m = NAME.search(h[:open_at + 1])
    return m.group(1) if m else None


def functions(path):
    """(name, first line, lines) of each function defined in the file at `path`."""
    with open(path, encoding="utf-8") as f:
        text = blank(f.read())
    found, start, i = [], 0, 0
    while i < len(text):
        c = text[i]
        if c in ";}":
            start = i + 1
        elif c == "{":
            header = text[start:i]
            if header.count("(") > header.count(")"):  # `= {}` inside a parameter list
                i = matching(text, i)
                continue
            name = signature_name(header)
            init = re.search(r"\)\s*(?:const\s*)?(?:noexcept\s*)?:(?!:)", header)
            if name and init and re.search(r"[\w>]\s*$", header):
                i = matching(text, i)  # a member's brace initializer: the body is later
                continue
            if name:
                first = start + len(header) - len(header.lstrip())
                end = matching(text, i)
                lines = text.count("\n", first, end) + 1
                found.append((name, text.count("\n", 0, first) + 1, lines))
                i, start = end, end
                continue
            start = i + 1  # a scope (namespace, class) or an initializer: read inside
        i += 1
    return found


def sources(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for folder, _, names in os.walk(path):
            for name in sorted(names):
                if name.endswith(SUFFIXES):
                    yield os.path.join(folder, name)


def read_known(path):
    """{(file, name): lines} of the functions listed in the file at `path`."""
    known = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            fields = line.split("#", 1)[0].split()
            if fields:
                known[(fields[0], fields[1])] = int(fields[2])
    return known


def problems(long, known):
    """What makes the check fail: unlisted or grown long functions, listed ones now
    within the limit."""
    found = {(path, name): lines for lines, path, _, name in long}
    out = [f"{path}: {name} has {lines} lines (not in the list of known long functions)"
           for (path, name), lines in found.items() if (path, name) not in known]
    out += [f"{path}: {name} grew from {known[(path, name)]} to {lines} lines"
            for (path, name), lines in found.items()
            if (path, name) in known and lines > known[(path, name)]]
    out += [f"{path}: {name} is within the limit now (or gone): take it off the list"
            for (path, name) in known if (path, name) not in found]
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lines", type=int, default=100)
    parser.add_argument("--known", help="the functions over the limit waiting to be split")
    parser.add_argument("paths", nargs="*")
    args = parser.parse_args(argv)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    paths = args.paths or [os.path.join(root, r) for r in ROOTS]
    long = []
    for path in sources(paths):
        for name, line, lines in functions(path):
            if lines > args.max_lines:
                long.append((lines, os.path.relpath(path, root), line, name))
    long.sort(reverse=True)
    for lines, path, line, name in long:
        print(f"{lines:5d}  {path}:{line}  {name}")
    print(f"{len(long)} functions over {args.max_lines} lines", file=sys.stderr)
    if args.known is None:
        return 1 if long else 0
    failures = problems(long, read_known(args.known))
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
