#!/usr/bin/env bash
# bench-gpt against the PyTorch peer in one run, same workload and thread count, and the ratios.
#   bash bench/gpt_vs_torch.sh [build dir] [python with torch]
# The peer runs from ../shared/peers/gpt_torch.py with a PyTorch installed by pip in a virtual
# environment outside the repo (it is a benchmark peer, not a dependency):
#   python3 -m venv ~/venv-torch && ~/venv-torch/bin/pip install torch
# PyTorch's bf16 autocast on CPUs without native bf16 takes minutes per step, so there its bf16
# run uses one timed step (CPUs with AVX512-BF16 or AMX get the same 5 steps as f32).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=${2:-python3}
PEER=../shared/peers/gpt_torch.py
THREADS=${THREADS:-2}
export OMP_NUM_THREADS=$THREADS PX_NUM_THREADS=$THREADS

ours=$("$BUILD"/bench/gpt_step --dtype both --steps 5 --warmup 2)
torch_f32=$("$PY" "$PEER" --threads "$THREADS" --dtype f32 --steps 5 --warmup 2)
if grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then BF16_STEPS=5; BF16_WARMUP=2; else BF16_STEPS=1; BF16_WARMUP=1; fi
torch_bf16=$("$PY" "$PEER" --threads "$THREADS" --dtype bf16 --steps "$BF16_STEPS" --warmup "$BF16_WARMUP")
echo "$ours"
echo "$torch_f32"
echo "$torch_bf16"
python3 - "$ours" "$torch_f32" "$torch_bf16" <<'PYEOF'
import json, sys
ours = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
peer = {d["dtype"]: d for d in (json.loads(sys.argv[2]), json.loads(sys.argv[3]))}
for o in ours:
    p = peer[o["dtype"]]
    print(json.dumps({"bench": "gpt_vs_torch", "dtype": o["dtype"], "threads": o["threads"],
                      "tokens_per_s": o["tokens_per_s"], "torch_tokens_per_s": p["tokens_per_s"],
                      "speedup_vs_torch": round(o["tokens_per_s"] / p["tokens_per_s"], 3),
                      "fraction_of_gemm_peak": o["fraction_of_peak"], "peak_bytes": o["peak_bytes"]}))
PYEOF
