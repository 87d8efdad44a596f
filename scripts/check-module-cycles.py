#!/usr/bin/env python3
"""Fails when source files import each other in a circle.

For each crate of the workspace (a directory holding src/lib.rs or
src/main.rs), every file is a module (src/a.rs or src/a/mod.rs is `a`,
src/a/b.rs is `a::b`). A file imports another when it names it by path —
`crate::..`, `super::..`, `self::..`, in a `use` tree or in the code — after
comments and string literals are blanked (rust_source.blank). A path resolves to the longest
module it starts with; a file naming itself, one of its ancestors or one of
its own descendants is not an import between files (Rust's module tree ties
those together anyway). Any strongly connected set of two or more files is
printed, with the imports that close it, and the script exits 1.

Usage: scripts/check-module-cycles.py [CRATE_DIR...] (default: every crate
under libs/, services/, loadtest/ and tests/).
"""
import os
import pathlib
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the clone
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import blank  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"


def use_paths(tree, prefix=()):
    """The paths a `use` tree names: `a::{b, c::d as e, self}`."""
    tree = tree.strip()
    if not tree:
        return
    depth, start, parts = 0, 0, []
    if tree.startswith("{") and tree.endswith("}"):
        body = tree[1:-1]
        for k, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == "," and depth == 0:
                parts.append(body[start:k])
                start = k + 1
        parts.append(body[start:])
        for part in parts:
            yield from use_paths(part, prefix)
        return
    m = re.match(rf"((?:{IDENT}\s*::\s*)*)(.*)", tree, re.S)
    segments = tuple(s.strip() for s in m.group(1).split("::") if s.strip())
    rest = m.group(2).strip()
    if rest.startswith("{"):
        yield from use_paths(rest, prefix + segments)
    else:
        name = re.match(rf"({IDENT}|\*)", rest)
        last = name.group(1) if name else ""
        path = prefix + segments + ((last,) if last not in ("", "*", "self") else ())
        yield path


def modules_of(crate):
    """Module path (tuple) -> file, for a crate's src/."""
    src = crate / "src"
    modules = {}
    for f in sorted(src.rglob("*.rs")):
        rel = f.relative_to(src).with_suffix("")
        parts = rel.parts
        if parts in (("lib",), ("main",)):
            modules[()] = f
        elif parts[0] == "bin":
            continue
        elif parts[-1] == "mod":
            modules[parts[:-1]] = f
        else:
            modules[parts] = f
    return modules


def imports(crate):
    modules = modules_of(crate)
    edges = {m: {} for m in modules}
    path_re = re.compile(rf"\b(crate|super|self)((?:\s*::\s*{IDENT})+)")
    use_re = re.compile(r"\buse\s+([^;]+);", re.S)
    for module, f in modules.items():
        text = blank(f.read_text())
        paths = []
        for m in use_re.finditer(text):
            for p in use_paths(m.group(1)):
                paths.append((p, text.count("\n", 0, m.start()) + 1))
        for m in path_re.finditer(text):
            segs = (m.group(1),) + tuple(s.strip() for s in m.group(2).split("::") if s.strip())
            paths.append((segs, text.count("\n", 0, m.start()) + 1))
        for segs, line in paths:
            if not segs:
                continue
            here = module if f.name in ("mod.rs", "lib.rs", "main.rs") or module == () else module
            if segs[0] == "crate":
                base, rest = (), segs[1:]
            elif segs[0] in ("super", "self"):
                base, rest = here, segs
                while rest and rest[0] in ("super", "self"):
                    if rest[0] == "super":
                        base = base[:-1]
                    rest = rest[1:]
            else:
                continue
            target = base + rest
            while target not in modules and target:
                target = target[:-1]
            if target == module or target[: len(module)] == module or module[: len(target)] == target:
                continue
            edges[module].setdefault(target, line)
    return modules, edges


def shown(path):
    """A path as printed: relative to the working directory."""
    return os.path.relpath(path)


def circles(edges):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = n[0]; n[0] += 1; stack.append(root); on.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = n[0]; n[0] += 1; stack.append(child); on.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    break
                if child in on:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        top = stack.pop(); on.discard(top); scc.append(top)
                        if top == node:
                            break
                    if len(scc) > 1:
                        out.append(sorted(scc))
    return out


def main(args):
    crates = [pathlib.Path(a) for a in args] or sorted(
        p.parent for p in ROOT.glob("*/*/src/lib.rs")) + sorted(
        p.parent for p in ROOT.glob("*/*/src/main.rs") if not (p.parent / "lib.rs").exists()) + [
        p.parent.parent for p in ROOT.glob("*/src/lib.rs")]
    crates = sorted({c.resolve() if c.name != "src" else c.parent.resolve() for c in crates})
    found, files = 0, 0
    for crate in crates:
        modules, edges = imports(crate)
        files += len(modules)
        for scc in circles(edges):
            found += 1
            print(f"{shown(crate)}: import circle between {len(scc)} files:")
            for m in scc:
                for t, line in sorted(edges[m].items()):
                    if t in scc:
                        print(f"  {shown(modules[m])}:{line} -> {shown(modules[t])}")
    if found:
        print(f"{found} import circle(s)", file=sys.stderr)
        return 1
    print(f"no import circles between the {files} files of {len(crates)} crates")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
