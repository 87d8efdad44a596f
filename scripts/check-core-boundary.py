#!/usr/bin/env python3
"""Fails when code outside libs/core reaches into a deciding core's insides.

The stack-assigner and the claim-allocator keep their state private and
export read models: the types their views return are re-exported at the
core's root (`switchyard_core::stack_assigner::Handover`,
`switchyard_core::claim_allocator::{Stage, Completion, check_key}`). Their
submodules (`stack_assigner::handover`, `claim_allocator::moves`, ...) are
the core's own; only libs/core — its sources and its tests — may name them.
Comments and strings are blanked first (rust_source.blank). Prints each use
with its file and line, and exits 1 if there is one.

Usage: scripts/check-core-boundary.py
"""
import pathlib
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the clone
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from rust_source import blank  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORES = ("stack_assigner", "claim_allocator")


def submodules(core):
    src = ROOT / "libs/core/src" / core
    return sorted(p.stem for p in src.glob("*.rs") if p.stem != "mod") + sorted(
        p.name for p in src.iterdir() if p.is_dir()
    )


def main():
    inside = {core: submodules(core) for core in CORES}
    patterns = []
    for core, mods in inside.items():
        names = "|".join(mods)
        # core::moves::X, and core::{.., moves::X, ..} or core::{.., moves, ..}
        patterns.append(re.compile(rf"\b{core}\s*::\s*(?:{names})\b"))
        patterns.append(re.compile(rf"\b{core}\s*::\s*\{{[^}}]*?\b(?:{names})\b"))
    found = []
    for path in sorted(ROOT.glob("**/*.rs")):
        rel = path.relative_to(ROOT)
        if rel.parts[0] in ("target", ".git") or rel.parts[:2] == ("libs", "core"):
            continue
        text = blank(path.read_text(encoding="utf-8"))
        for pattern in patterns:
            for m in pattern.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{rel}:{line}: {' '.join(m.group(0).split())}")
    if found:
        print("outside libs/core, these name a core's insides; use the types")
        print("its root re-exports (its read models) instead:")
        for f in found:
            print("  " + f)
        return 1
    print(f"no use of {', '.join(CORES)}'s submodules outside libs/core")
    return 0


if __name__ == "__main__":
    sys.exit(main())
