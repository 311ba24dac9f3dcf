#!/usr/bin/env python3
"""Passes recognise primitives by typed handle or trait, never by comparing a name.

A primitive's name lives where it is registered: src/ops/ (and src/sharding/prims.cc for the SPMD
primitives). Everywhere else a pass compares `n.prim` with a handle (src/ops/prims.h,
src/sharding/prims.h: a misspelt name there is a compile error) or asks a trait of the Primitive.
This check fails on a comparison of a primitive's name (`prim->name == "..."`, `!=`, or a literal
looked up with get_primitive("...")) in any other file of src/ or include/. Comparisons that are
known and not yet replaced are listed in KNOWN with what replaces them; a listed one that is gone
fails too, so the list only shrinks.

    python3 scripts/check_primitive_names.py            # from the repository root; exit 1 on a violation
    python3 scripts/check_primitive_names.py --root DIR # check another tree (its own test plants one)
"""
import argparse
import os
import re
import sys

OWNERS = ("src/ops/", "src/sharding/prims.cc")

PATTERNS = [
    re.compile(r'prim->name\s*(==|!=)'),
    re.compile(r'(==|!=)\s*[\w.\[\]>-]*prim->name\b'),
    re.compile(r'get_primitive\(\s*"'),
]

# file -> (number of comparisons, what replaces them). Keep this list short and shrinking.
KNOWN = {}


def comparisons(root):
    found = {}
    for top in ("src", "include"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if not f.endswith((".cc", ".h", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                if rel.startswith(OWNERS[0]) or rel == OWNERS[1]:
                    continue
                with open(path, encoding="utf-8") as fh:
                    for n, line in enumerate(fh, 1):
                        code = line.split("//")[0]
                        if any(p.search(code) for p in PATTERNS):
                            found.setdefault(rel, []).append((n, line.strip()))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    args = ap.parse_args()
    found = comparisons(args.root)
    errors = []
    for rel, hits in sorted(found.items()):
        allowed = KNOWN.get(rel, (0, ""))[0]
        if len(hits) > allowed:
            for n, text in hits:
                errors.append(f"{rel}:{n}: compares a primitive's name: {text}\n"
                              f"  compare n.prim with a handle (src/ops/prims.h) or ask a trait of the Primitive")
    for rel, (count, why) in sorted(KNOWN.items()):
        have = len(found.get(rel, []))
        if have < count:
            errors.append(f"{rel}: KNOWN lists {count} name comparison(s) but {have} remain: "
                          f"lower the count in scripts/check_primitive_names.py ({why})")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    total = sum(len(h) for h in found.values())
    print(f"check_primitive_names: no name comparisons outside {', '.join(OWNERS)} "
          f"but {total} known ({len(KNOWN)} file(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
