#!/usr/bin/env bash
# Paired, interleaved bench/remat step times of two builds (e.g. a baseline worktree and this one):
# each round runs both builds once, alternating which runs first (each run interleaves its
# policies' timed steps itself), and prints per policy the median per-round ratio old/new of the
# step time (> 1: new faster) with its range; then, per policy, the new build's planned and
# measured peak bytes from its last run and whether they are equal.
#   bash bench/paired_remat.sh OLD_BUILD_DIR NEW_BUILD_DIR [rounds=5] [remat flags...]
#   git worktree add /tmp/base REV && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release -DPX_BUILD_TESTS=OFF && cmake --build /tmp/base/build --target remat
#   bash bench/paired_remat.sh /tmp/base/build build 5 --layers 6 --seq 512
# (Flags after the rounds go to both builds' bench/remat, so both must know them. ROWS=FILE keeps
# every run's JSON lines there, each after its round and build.)
set -euo pipefail
source "$(dirname "$0")/paired.sh"
paired_args remat "${1:-}" "${2:-}" "${3:-5}"
shift $(( $# < 3 ? $# : 3 ))
paired_run remat "$@"
python3 - "$rows" <<'PYEOF'
import json, statistics, sys
t, last_new, order = {}, {}, []
for line in open(sys.argv[1]):
    i, w, js = line.split(" ", 2)
    d = json.loads(js)
    p = d["policy"].split(":")[0]  # auto: what it chose may be named differently
    if p not in order:
        order.append(p)
    t.setdefault(p, {}).setdefault(i, {})[w] = d["step_s"]
    if w == "new":
        last_new[p] = d
for p in order:
    r = [x["old"] / x["new"] for x in t[p].values() if len(x) == 2 and x["new"] > 0]
    row = {"bench": "paired_remat", "policy": p, "rounds": len(r)}
    if r:
        row.update(median_old_over_new=round(statistics.median(r), 3), min=round(min(r), 3), max=round(max(r), 3))
    if p in last_new:
        d = last_new[p]
        row.update(new_planned_peak_bytes=d["planned_peak_bytes"], new_measured_peak_bytes=d["measured_peak_bytes"],
                   planned_equals_measured=d["planned_peak_bytes"] == d["measured_peak_bytes"])
    print(json.dumps(row))
PYEOF
