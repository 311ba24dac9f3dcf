#!/usr/bin/env python3
"""Passes recognise primitives by typed handle or trait, never by comparing a name.

A primitive's name lives where it is registered: src/ops/ (and src/sharding/prims.cc for the SPMD
primitives). Everywhere else a pass compares `n.prim` with a handle (src/ops/prims.h,
src/sharding/prims.h: a misspelt name there is a compile error) or asks a trait of the Primitive.
This check fails on a comparison of a primitive's name (`prim->name == "..."`, `!=`, or a literal
looked up with get_primitive("...")) in any other file of src/ or include/. With the registered
names (--names-from, a program that prints them: ctest passes build/tests/list_primitives) it also
finds a name however it is compared: a registered name as a string literal on either side of
`==` / `!=` (a helper that returns `prim->name`, a local copy of it), or two or more registered
names on one line (a set or list of primitives by name). Comparisons that are known and not yet
replaced are listed in KNOWN with what replaces them; a listed one that is gone fails too, so the
list only shrinks.

    python3 scripts/check_primitive_names.py            # from the repository root; exit 1 on a violation
    python3 scripts/check_primitive_names.py --root DIR # check another tree (its own test plants one)
    python3 scripts/check_primitive_names.py --names-from build/tests/list_primitives
"""
import argparse
import os
import re
import subprocess
import sys

OWNERS = ("src/ops/", "src/sharding/prims.cc")

PATTERNS = [
    re.compile(r'prim->name\s*(==|!=)'),
    re.compile(r'(==|!=)\s*[\w.\[\]>-]*prim->name\b'),
    re.compile(r'get_primitive\(\s*"'),
]

# file -> (number of comparisons, what replaces them). Keep this list short and shrinking.
KNOWN = {}

# Words that name a primitive and also something else, compared or listed as that other thing:
# (file, word) -> what the word means there. A registered name in these files is not a violation
# when it is one of the listed words.
OTHER_MEANINGS = {
    ("src/backend/cpu/nn.cc", "tanh"): "gelu's `approximate` attribute",
    ("src/backend/ref/nn.cc", "tanh"): "gelu's `approximate` attribute",
    ("src/backend/cpu/vmath.cc", "exp"): "the vector-math functions by name (vecmath_eval, a test hook)",
    ("src/backend/cpu/vmath.cc", "log"): "the vector-math functions by name",
    ("src/backend/cpu/vmath.cc", "tanh"): "the vector-math functions by name",
    ("src/backend/cpu/vmath.cc", "sigmoid"): "the vector-math functions by name",
    ("src/distributed/communicator.cc", "all_reduce"): "CollectiveKind's names",
    ("src/distributed/communicator.cc", "all_gather"): "CollectiveKind's names",
    ("src/distributed/communicator.cc", "reduce_scatter"): "CollectiveKind's names",
    ("src/distributed/communicator.cc", "all_to_all"): "CollectiveKind's names",
    ("src/sharding/auto/cluster.cc", "all_reduce"): "keys of a cluster file's [in_process] table",
    ("src/sharding/auto/cluster.cc", "all_gather"): "keys of a cluster file's [in_process] table",
    ("src/sharding/auto/cluster.cc", "reduce_scatter"): "keys of a cluster file's [in_process] table",
    ("src/sharding/auto/cluster.cc", "all_to_all"): "keys of a cluster file's [in_process] table",
    ("src/nn/pretrained/llama.cc", "silu"): "a Hugging Face config's hidden_act",
    ("src/nn/transformer.cc", "layer_norm"): "NormKind's names in a model config",
    ("src/nn/transformer.cc", "rms_norm"): "NormKind's names in a model config",
    ("src/pax/config.cc", "constant"): "a learning-rate schedule",
    ("src/pax/config.cc", "rsqrt"): "a learning-rate schedule",
    ("src/pax/validate.cc", "rsqrt"): "a learning-rate schedule",
}


LITERAL = re.compile(r'"([A-Za-z_][A-Za-z0-9_]*)"')


def names_compared(code, names, rel):
    """Whether `code` compares a registered name (a literal beside == or !=) or lists several."""
    hits = [m for m in LITERAL.finditer(code) if m.group(1) in names and (rel, m.group(1)) not in OTHER_MEANINGS]
    if len(hits) >= 2:
        return True
    for m in hits:
        before, after = code[:m.start()].rstrip(), code[m.end():].lstrip()
        if before.endswith(("==", "!=")) or after.startswith(("==", "!=")):
            return True
    return False


def comparisons(root, names=frozenset()):
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
                        if any(p.search(code) for p in PATTERNS) or names_compared(code, names, rel):
                            found.setdefault(rel, []).append((n, line.strip()))
    return found


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default=".")
    ap.add_argument("--names-from", help="a program that prints the registered primitive names, one per line")
    args = ap.parse_args()
    names = frozenset()
    if args.names_from:
        out = subprocess.run([args.names_from], capture_output=True, text=True, check=True).stdout
        names = frozenset(n for n in out.split() if n)
        if not names:
            print(f"{args.names_from} printed no primitive names", file=sys.stderr)
            return 1
    found = comparisons(args.root, names)
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
    for (rel, word), why in sorted(OTHER_MEANINGS.items()):
        path = os.path.join(args.root, rel)
        if names and (not os.path.exists(path) or f'"{word}"' not in open(path, encoding="utf-8").read()):
            errors.append(f"{rel}: OTHER_MEANINGS lists \"{word}\" ({why}) but the file no longer has it: "
                          f"delete the entry in scripts/check_primitive_names.py")
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    total = sum(len(h) for h in found.values())
    print(f"check_primitive_names: no name comparisons outside {', '.join(OWNERS)} "
          f"but {total} known ({len(KNOWN)} file(s)); {len(names)} registered names looked for")
    return 0


if __name__ == "__main__":
    sys.exit(main())
