#!/usr/bin/env bash
# The f32 GEMM candidates on the matmul shapes of bench-gpt's training step, in one run
# (bench/gemm_candidates.cc): Debian's oneDNN 2.6, Parallax's own GEMM, oneDNN 3.x from PyPI,
# BLIS and libxsmm from Debian.
#   bash bench/gemm_candidates.sh [build dir]
# It installs the optional candidates first: BLIS (libblis4-openmp) and libxsmm (libxsmm-dev) with
# apt-get, and two oneDNN 3.x wheels into virtual environments outside the repo (benchmark peers,
# not dependencies): `onednn-cpu-gomp` (oneDNN 3.2, OpenMP runtime like Debian's 2.6) and `onednn`
# (the newest, TBB runtime, with the Intel runtime wheels it needs).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
shift || true
VENVS=${PX_BENCH_VENVS:-$HOME/venv-onednn}
THREADS=${THREADS:-2}
export OMP_NUM_THREADS=$THREADS

# Installing BLIS makes it the system's libblas.so.3; the benchmark loads it by path, so put back
# whatever provided libblas.so.3 before.
blas_before=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | awk '/^Value:/{print $2}' || true)
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libblis4-openmp libxsmm-dev >/dev/null
if [ -n "$blas_before" ]; then update-alternatives --set libblas.so.3-x86_64-linux-gnu "$blas_before" >/dev/null; fi

for w in onednn-cpu-gomp onednn; do
  [ -x "$VENVS-$w/bin/pip" ] || python3 -m venv "$VENVS-$w"
  "$VENVS-$w/bin/pip" install -q "$w"
done
cmake "$BUILD" >/dev/null  # finds libxsmm
cmake --build "$BUILD" --target gemm_candidates >/dev/null

# The TBB build finds its runtime libraries beside it.
LD_LIBRARY_PATH="$VENVS-onednn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$BUILD"/bench/gemm_candidates \
  --onednn="$VENVS-onednn-cpu-gomp/lib/libdnnl.so.3" --onednn="$VENVS-onednn/lib/libdnnl.so.3" "$@"
