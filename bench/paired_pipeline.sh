#!/usr/bin/env bash
# Paired, interleaved bench/pipeline runs of two builds (e.g. a baseline worktree and this one),
# alternating which runs first: per schedule the median ratio of step times old/new (> 1: new
# faster) with its range, and the new build's measured bubble against theory in each round.
#   bash bench/paired_pipeline.sh OLD_BUILD_DIR NEW_BUILD_DIR [rounds=3] [pipeline flags...]
set -euo pipefail
source "$(dirname "$0")/paired.sh"
paired_args pipeline "${1:-}" "${2:-}" "${3:-3}"
shift $(( $# < 3 ? $# : 3 ))
paired_run pipeline "$@"
python3 - "$rows" <<'PYEOF'
import json, statistics, sys
rows = []
for line in open(sys.argv[1]):
    i, w, js = line.split(" ", 2)
    rows.append(dict(json.loads(js), round=int(i), build=w))
for sch in dict.fromkeys(r["schedule"] for r in rows):
    ratios, bubbles = [], []
    for i in sorted({r["round"] for r in rows}):
        pick = lambda w: next(r for r in rows if r["round"] == i and r["build"] == w and r["schedule"] == sch)
        old, new = pick("old"), pick("new")
        ratios.append(old["step_s"] / new["step_s"])
        if "bubble_measured" in new:
            bubbles.append([round(new["bubble_measured"], 3), round(new["bubble_theory"], 3)])
    print(json.dumps({"bench": "paired_pipeline", "schedule": sch, "rounds": len(ratios),
                      "median_old_over_new": round(statistics.median(ratios), 3),
                      "min": round(min(ratios), 3), "max": round(max(ratios), 3),
                      "new_bubble_measured_vs_theory": bubbles}))
PYEOF
