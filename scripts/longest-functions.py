#!/usr/bin/env python3
"""Lists the longest `fn` bodies in the workspace's .rs files, longest first,
as "lines path:line name": a function is a page, and this finds the ones
that are not. Bodies are found by brace matching after comments, strings,
char literals and raw strings are blanked out (rust_source.blank), so no
compiler is needed. A fn nested in another counts on its own and inside its
parent.

    scripts/longest-functions.py [-n N] [--no-tests] [PATH...]

-n N        how many to print (default 20)
--no-tests  leave out tests/ directories and `#[cfg(test)]` modules
            (inline, or the files a `#[cfg(test)] mod name;` names)
PATH...     directories or .rs files to look in (default: the whole
            workspace); target/ and hidden directories are always skipped
"""
import argparse
import os
import pathlib
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the clone
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import blank  # noqa: E402

parser = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1].strip())
parser.add_argument("-n", type=int, default=20, dest="count")
parser.add_argument("--no-tests", action="store_true")
parser.add_argument("paths", nargs="*")
options = parser.parse_args()
count, no_tests = options.count, options.no_tests
roots = options.paths or [str(pathlib.Path(__file__).resolve().parent.parent)]
if not options.paths:
    os.chdir(roots[0])
    roots = ["."]


FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")
# `#[cfg(test)]` (and any attributes after it) before `mod name {` or `mod name;`.
TEST_MOD = re.compile(
    r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*([{;])"
)


def close_of(text, open_at):
    """Index of the `}` matching the `{` at open_at."""
    depth = 0
    for k in range(open_at, len(text)):
        if text[k] == "{":
            depth += 1
        elif text[k] == "}":
            depth -= 1
            if depth == 0:
                return k
    return len(text) - 1


def test_module_files(path, text):
    """The files of the `#[cfg(test)] mod name;` that `path` declares."""
    base = os.path.dirname(path)
    stem = os.path.basename(path)[:-3]
    if stem not in ("lib", "main", "mod"):
        base = os.path.join(base, stem)
    for m in TEST_MOD.finditer(text):
        if m.group(2) == ";":
            name = m.group(1)
            yield os.path.normpath(os.path.join(base, name + ".rs"))
            yield os.path.normpath(os.path.join(base, name, "mod.rs"))


def functions(text):
    """(lines, first line, name) of each fn with a body in `text`."""
    skipped = []
    if no_tests:
        for m in TEST_MOD.finditer(text):
            if m.group(2) == "{":
                skipped.append((m.start(), close_of(text, m.end() - 1)))
    for m in FN.finditer(text):
        if any(a <= m.start() <= b for a, b in skipped):
            continue
        # The body opens at the first `{` outside (), [] and the signature's
        # generics; a `;` first means a declaration without a body.
        depth, k = 0, m.end()
        while k < len(text):
            ch = text[k]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif depth == 0 and ch in "{;":
                break
            k += 1
        if k >= len(text) or text[k] == ";":
            continue
        end = close_of(text, k)
        first = text.count("\n", 0, m.start()) + 1
        last = text.count("\n", 0, end) + 1
        yield last - first + 1, first, m.group(1)


paths = []
for root in roots:
    if os.path.isfile(root):
        paths.append(os.path.normpath(root))
        continue
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != "target" and not d.startswith(".") and not (no_tests and d == "tests")
        )
        for name in sorted(filenames):
            if name.endswith(".rs"):
                paths.append(os.path.normpath(os.path.join(dirpath, name)))

texts = {}
for path in paths:
    with open(path, encoding="utf-8", errors="replace") as f:
        texts[path] = blank(f.read())
test_files = set()
if no_tests:
    for path, text in texts.items():
        test_files.update(test_module_files(path, text))

found = []
for path, text in texts.items():
    if path in test_files:
        continue
    for lines, line, fn in functions(text):
        found.append((lines, path, line, fn))

found.sort(key=lambda f: (-f[0], f[1], f[2]))
for lines, path, line, fn in found[:count]:
    print(f"{lines} {path}:{line} {fn}")
