#!/usr/bin/env python3
"""The folders of src/ form a layered DAG: each may include only the layers below it.

Reads every #include "..." in src/ and include/parallax/ (a public header counts as the src/
folder that implements it, see HEADERS), builds the include graph between folders and fails on
any edge from a layer to one above it or beside it, and on any cycle. The layers are written
down once, in LAYERS (docs/architecture.md shows them). Back-edges that are known and not yet
removed are listed in KNOWN, each with what removes it; a listed edge that no longer exists
fails too, so the list only shrinks.

    python3 scripts/check_layering.py            # from the repository root; exit 1 on a violation
    python3 scripts/check_layering.py --graph    # print the folder graph
    python3 scripts/check_layering.py --root DIR # check another tree (its own test plants an edge)
"""
import argparse
import os
import re
import sys

# Lowest first. Folders of one layer may include each other (they are one layer split for reading).
LAYERS = [
    ["core"],
    ["io"],
    ["ir"],
    ["ops", "autodiff"],
    ["backend"],
    ["distributed"],
    ["runtime"],
    ["memory"],
    ["optim", "text"],
    ["data"],
    ["sharding"],
    ["nn"],
    ["checkpoint"],
    ["train"],
    ["pax"],
]

# include/parallax/<header> -> the folder that implements it (parallax.h includes them all).
HEADERS = {
    "core.h": "core", "memory.h": "core", "io.h": "io", "graph.h": "ir", "ops.h": "ops",
    "autodiff.h": "autodiff", "passes.h": "runtime", "runtime.h": "runtime", "collectives.h": "distributed",
    "distributed.h": "distributed", "remat.h": "memory", "nn.h": "nn", "optim.h": "optim",
    "text.h": "text", "data.h": "data", "text_data.h": "data", "sharding.h": "sharding", "spmd.h": "sharding",
    "strategy.h": "sharding", "auto.h": "sharding", "parallel.h": "sharding", "checkpoint.h": "checkpoint",
    "train.h": "train", "plan.h": "train", "pax.h": "pax", "pipeline.h": "sharding",
    "backend.h": "backend", "communicator.h": "distributed",
    # The backend conformance suite (header-only): its cases use the sharding and optimizer ops.
    "testing/conformance.h": "sharding",
}
UMBRELLA = {"parallax.h"}

# Known back-edges (from -> to): what removes each. Keep this list short and shrinking.
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of():
    rank = {}
    for i, layer in enumerate(LAYERS):
        for folder in layer:
            rank[folder] = i
    return rank


def target_folder(inc, src_folders):
    if inc.startswith("parallax/nn/"):
        return "nn"
    if inc.startswith("parallax/"):
        name = inc[len("parallax/"):]
        if name in UMBRELLA:
            return None
        if name not in HEADERS:
            raise SystemExit(f"check_layering: include/parallax/{name} is in no layer: add it to HEADERS")
        return HEADERS[name]
    top = inc.split("/")[0]
    return top if top in src_folders else None


def edges_of(root):
    """{(from, to): [file:line, ...]} over src/ and include/parallax/."""
    src = os.path.join(root, "src")
    src_folders = {d for d in os.listdir(src) if os.path.isdir(os.path.join(src, d))}
    files = []
    for dirpath, _, names in os.walk(src):
        rel = os.path.relpath(dirpath, src).split(os.sep)
        for n in names:
            if n.endswith((".h", ".cc", ".cu")):
                files.append((os.path.join(dirpath, n), rel[0] if rel[0] != "." else None))
    inc_dir = os.path.join(root, "include", "parallax")
    for dirpath, _, names in os.walk(inc_dir):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), inc_dir)
            if rel in UMBRELLA:
                continue
            folder = "nn" if rel.startswith("nn" + os.sep) else HEADERS.get(rel)
            if folder is None:
                raise SystemExit(f"check_layering: include/parallax/{rel} is in no layer: add it to HEADERS")
            files.append((os.path.join(dirpath, n), folder))
    edges = {}
    for path, folder in files:
        if folder is None:
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for ln, line in enumerate(f, 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                inc = m.group(1)
                if inc.startswith(".."):
                    edges.setdefault((folder, "(relative)"), []).append(f"{os.path.relpath(path, root)}:{ln}")
                    continue
                to = target_folder(inc, src_folders)
                if to and to != folder:
                    edges.setdefault((folder, to), []).append(f"{os.path.relpath(path, root)}:{ln}")
    return edges, src_folders


def cycles(edges):
    graph = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--graph", action="store_true", help="print the folder graph and exit")
    args = ap.parse_args()
    rank = layer_of()
    edges, folders = edges_of(args.root)
    if args.graph:
        for (a, b), where in sorted(edges.items()):
            print(f"{a} -> {b} ({len(where)})")
        return 0
    problems = []
    for f in sorted(folders - set(rank)):
        problems.append(f"src/{f}/ is in no layer: add it to LAYERS in scripts/check_layering.py "
                        "(and to docs/architecture.md)")
    for (a, b), where in sorted(edges.items()):
        if b == "(relative)":
            problems.append(f"{a} includes by a relative path ({where[0]}): include from src/ or include/")
            continue
        if a not in rank or b not in rank or rank[b] < rank[a] or (a, b) in KNOWN:
            continue
        if rank[b] == rank[a] and set(LAYERS[rank[a]]) >= {a, b}:
            continue
        problems.append(f"{a} (layer {rank[a]}) includes {b} (layer {rank[b]}), a layer "
                        f"{'beside' if rank[a] == rank[b] else 'above'} it: {', '.join(where[:3])}"
                        f"{' ...' if len(where) > 3 else ''}; move the code to the lower layer or the include "
                        "to the higher one")
    for (a, b), why in sorted(KNOWN.items()):
        if (a, b) not in edges:
            problems.append(f"the known back-edge {a} -> {b} is gone: delete it from KNOWN in "
                            "scripts/check_layering.py")
    allowed = {e: w for e, w in edges.items() if e[1] in rank and e[0] in rank and
               (rank[e[1]] < rank[e[0]] or rank[e[1]] == rank[e[0]])}
    for c in cycles(allowed):
        if all((c[i], c[i + 1]) in KNOWN or rank[c[i]] == rank[c[i + 1]] for i in range(len(c) - 1)):
            continue
        problems.append("cycle: " + " -> ".join(c))
    if problems:
        print("check_layering: the folders of src/ are not a layered DAG:", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        return 1
    known = f", {len(KNOWN)} known back-edges" if KNOWN else ""
    print(f"check_layering: {len(edges)} folder edges, all downward ({len(LAYERS)} layers{known})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
