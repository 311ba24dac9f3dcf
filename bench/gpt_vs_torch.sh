#!/usr/bin/env bash
# bench-gpt against the PyTorch peer in one run, same workload and thread count, and the ratios.
#   bash bench/gpt_vs_torch.sh [build dir] [python with torch]
#   FLAVOUR=llama bash bench/gpt_vs_torch.sh ...   # the Llama flavour of equal size
#   SIZE=gpt2_small bash bench/gpt_vs_torch.sh ...  # GPT-2 small's shape (124M params, seq 1024, batch 2)
# The peer runs the shape our run reports (its JSON names vocab, d, heads, ... : gpt_common.h is
# the one place a size is defined).
# The GPT peer runs from ../shared/peers/gpt_torch.py, the Llama one from bench/peers/llama_torch.py
# (the same model in PyTorch: RMSNorm, rotary, GQA through scaled_dot_product_attention, SwiGLU), with a PyTorch installed by pip in a virtual
# environment outside the repo (it is a benchmark peer, not a dependency):
#   python3 -m venv ~/venv-torch && ~/venv-torch/bin/pip install torch
# It prints the machine's FMA-loop peak and the sgemm rate on the step's shapes (bench/peak.h),
# our tokens/s and fraction of the FMA peak, PyTorch eager and torch.compile tokens/s, and the
# ratios. PyTorch's bf16 autocast on CPUs without native bf16 takes minutes per step, so there its
# bf16 run is one eager step (CPUs with AVX512-BF16 or AMX get 5 steps, eager and compiled).
#   ROUNDS=5 bash bench/gpt_vs_torch.sh ...      # 5 rounds, each ours then the peers, and the median
# On a shared machine whose speed moves within minutes, one run of each cannot resolve a ratio:
# with ROUNDS > 1 every round prints its lines, and a last `gpt_vs_torch_rounds` line per dtype
# gives the median, minimum and maximum of the per-round ratios (each round's programs ran one
# after another, minutes apart at most).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=${2:-python3}
FLAVOUR=${FLAVOUR:-gpt2}
case "$FLAVOUR" in
  gpt2) PEER=../shared/peers/gpt_torch.py ;;
  llama) PEER=bench/peers/llama_torch.py ;;
  *) echo "FLAVOUR must be gpt2 or llama, not '$FLAVOUR'" >&2; exit 2 ;;
esac
SIZE=${SIZE:-bench}
THREADS=${THREADS:-2}
export OMP_NUM_THREADS=$THREADS PX_NUM_THREADS=$THREADS

ROUNDS=${ROUNDS:-1}
if ! [[ $ROUNDS =~ ^[0-9]+$ ]] || ((10#$ROUNDS == 0)); then
  echo "ROUNDS must be a positive integer, not '$ROUNDS'" >&2
  exit 2
fi
ROUNDS=$((10#$ROUNDS))

# One round: our step in both dtypes, then PyTorch eager and compiled (torch.compile: PyTorch at
# its fastest) per dtype on our shape; prints every program's JSON and one gpt_vs_torch line per
# dtype.
one_round() {
  local ours shape torch_f32 torch_f32_c torch_bf16 torch_bf16_c
  ours=$("$BUILD"/bench/gpt_step --flavour "$FLAVOUR" --size "$SIZE" --dtype both --steps 5 --warmup 2 --matmuls 0)
  shape=$(python3 -c '
import json, sys
o = json.loads(sys.argv[1].splitlines()[0])
keys = ["vocab", "d", "heads", "layers", "ff", "seq", "batch"] + (["kv_heads"] if o["flavour"] == "llama" else [])
print(" ".join(f"--{k} {o[k]}" for k in keys))' "$ours")
  # shellcheck disable=SC2086
  peer() { "$PY" "$PEER" --threads "$THREADS" $shape "$@"; }
  torch_f32=$(peer --dtype f32 --steps 5 --warmup 2)
  torch_f32_c=$(peer --dtype f32 --steps 5 --warmup 2 --compile 1)
  if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    torch_bf16=$(peer --dtype bf16 --steps 5 --warmup 2)
    torch_bf16_c=$(peer --dtype bf16 --steps 5 --warmup 2 --compile 1)
  else
    echo "this CPU has no native bf16 (AVX512-BF16 or AMX): PyTorch's bf16 gets one eager step, no compiled run" >&2
    torch_bf16=$(peer --dtype bf16 --steps 1 --warmup 1)
    torch_bf16_c=""
  fi
  echo "$ours"
  printf '%s\n' "$torch_f32" "$torch_f32_c" "$torch_bf16" "$torch_bf16_c" | grep -v '^$'
  python3 - "$ours" "$torch_f32" "$torch_f32_c" "$torch_bf16" "$torch_bf16_c" <<'PYEOF'
import json, sys
ours = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
eager = {d["dtype"]: d for d in (json.loads(sys.argv[2]), json.loads(sys.argv[4]))}
compiled = {d["dtype"]: d for d in (json.loads(a) for a in (sys.argv[3], sys.argv[5]) if a.strip())}
for o in ours:
    e, c = eager[o["dtype"]], compiled.get(o["dtype"])
    print(json.dumps({"bench": "gpt_vs_torch", "flavour": o["flavour"], "size": o["size"], "dtype": o["dtype"], "threads": o["threads"], "isa": o["isa"],
                      "fma_peak_gflops": o["fma_peak_gflops"],
                      "gemm_step_shapes_gflops": o["gemm_step_shapes_gflops"],
                      "tokens_per_s": o["tokens_per_s"], "fraction_of_fma_peak": o["fraction_of_fma_peak"],
                      "torch_eager_tokens_per_s": e["tokens_per_s"],
                      "torch_compile_tokens_per_s": c["tokens_per_s"] if c else None,
                      "speedup_vs_torch_eager": round(o["tokens_per_s"] / e["tokens_per_s"], 3),
                      "speedup_vs_torch_compile": round(o["tokens_per_s"] / c["tokens_per_s"], 3) if c else None,
                      "fraction_of_gemm_peak": o["fraction_of_peak"], "peak_bytes": o["peak_bytes"]}))
PYEOF
}

all=""
for ((r = 1; r <= ROUNDS; ++r)); do
  out=$(one_round)
  echo "$out"
  all+="$out"$'\n'
done
[ "$ROUNDS" -gt 1 ] || exit 0
python3 - "$all" <<'PYEOF'
import json, statistics, sys
lines = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
rows = [l for l in lines if l.get("bench") == "gpt_vs_torch"]
for dtype in dict.fromkeys(r["dtype"] for r in rows):
    rs = [r for r in rows if r["dtype"] == dtype]
    out = {"bench": "gpt_vs_torch_rounds", "flavour": rs[0]["flavour"], "size": rs[0]["size"], "dtype": dtype,
           "rounds": len(rs)}
    for key in ("tokens_per_s", "torch_eager_tokens_per_s", "torch_compile_tokens_per_s",
                "speedup_vs_torch_eager", "speedup_vs_torch_compile", "fraction_of_fma_peak"):
        v = [r[key] for r in rs if r[key] is not None]
        if v:
            out[key] = {"median": round(statistics.median(v), 3), "min": min(v), "max": max(v)}
    print(json.dumps(out))
PYEOF
