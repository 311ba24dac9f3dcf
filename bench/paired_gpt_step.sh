#!/usr/bin/env bash
# Paired, interleaved bench-gpt step times of two builds (e.g. a baseline worktree and this one),
# alternating which runs first, and the median per-pair ratio old/new per dtype (> 1: new faster).
#   bash bench/paired_gpt_step.sh OLD_BUILD_DIR NEW_BUILD_DIR [pairs=8] [gpt_step flags...]
#   git worktree add /tmp/base REV && cmake -S /tmp/base -B /tmp/base/build -G Ninja \
#     -DCMAKE_BUILD_TYPE=Release && cmake --build /tmp/base/build --target gpt_step
#   bash bench/paired_gpt_step.sh /tmp/base/build build 8
#   DTYPES=bf16 bash bench/paired_gpt_step.sh OLD NEW 6 --size gpt2_small --steps 3 --warmup 1
# (DTYPES: the dtypes to pair, default "f32 bf16"; later flags override the 5 steps and 2 warm-ups.)
set -euo pipefail
OLD=${1:?old build dir}
NEW=${2:?new build dir}
PAIRS=${3:-8}
DTYPES=${DTYPES:-f32 bf16}
for dt in $DTYPES; do
  [[ $dt == f32 || $dt == bf16 ]] || { echo "DTYPES: f32 and/or bf16, not '$dt'" >&2; exit 2; }
done
shift $(( $# < 3 ? $# : 3 ))
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
for i in $(seq 1 "$PAIRS"); do
  for dt in $DTYPES; do
    if (( i % 2 )); then order="old new"; else order="new old"; fi
    for w in $order; do
      dir=$NEW; [ "$w" = old ] && dir=$OLD
      s=$("$dir"/bench/gpt_step --dtype "$dt" --steps 5 --warmup 2 "$@" | grep -o '"step_s": [0-9.]*' | awk '{print $2}')
      echo "$i $dt $w $s" >> "$rows"
    done
  done
done
python3 - "$rows" <<'PYEOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
for dt in ("f32", "bf16"):
    t = {}
    if not any(d == dt for _, d, _, _ in rows):
        continue
    for i, d, w, s in rows:
        if d == dt:
            t.setdefault(i, {})[w] = float(s)
    r = [p["old"] / p["new"] for p in t.values() if len(p) == 2]
    print(json.dumps({"bench": "paired_gpt_step", "dtype": dt, "pairs": len(r),
                      "median_old_over_new": round(statistics.median(r), 3), "min": round(min(r), 3),
                      "max": round(max(r), 3)}))
PYEOF
