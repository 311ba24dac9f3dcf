#!/usr/bin/env bash
# Paired, interleaved bench/pipeline runs of two builds (e.g. a baseline worktree and this one),
# alternating which runs first: per schedule the median ratio of step times old/new (> 1: new
# faster) with its range, and the new build's measured bubble against theory in each round.
#   bash bench/paired_pipeline.sh OLD_BUILD_DIR NEW_BUILD_DIR [rounds=3] [pipeline flags...]
set -euo pipefail
OLD=${1:?old build dir}
NEW=${2:?new build dir}
ROUNDS=${3:-3}
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "rounds: a positive integer, not '$ROUNDS'" >&2; exit 2; }
shift $(( $# < 3 ? $# : 3 ))
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for i in $(seq 1 "$ROUNDS"); do
  if (( i % 2 )); then order="old new"; else order="new old"; fi
  for w in $order; do
    dir=$NEW; [ "$w" = old ] && dir=$OLD
    "$dir"/bench/pipeline "$@" | sed "s/^{/{\"round\":$i,\"build\":\"$w\",/" >> "$rows"
  done
done
python3 - "$rows" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
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
