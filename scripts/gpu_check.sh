#!/usr/bin/env bash
# On a machine with an NVIDIA GPU (issue 50): build with the CUDA backend and run what it has on
# the device, each step timed, in one go that fits a short device lease:
#   1. the CUDA backend's own tests: a generated fused kernel and a cuBLASLt matmul against host
#      results (backend_test_cuda_backend);
#   2. the conformance suite on `cuda` against `ref`, forward and vjp, every case whose
#      primitives have CUDA kernels; the cases that lack one are listed (backend_test_cuda_conformance);
#   3. training GPT-2 small and a Llama-style model against the CPU losses, DDP over two GPUs and
#      tokens/s and MFU against torch.compile: not yet, and said so, until attention (cuDNN) and the
#      NCCL communicator exist (docs/gpu.md).
#   bash scripts/gpu_check.sh            # build dir: build-gpu (PX_BUILD_DIR to change)
# Exit status: 0 when everything that ran passed, 1 when something failed, 77 without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${PX_BUILD_DIR:-build-gpu}
start=$(date +%s)
step() { echo "gpu_check: $* ($(( $(date +%s) - start )) s)"; }

if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L; then
  echo "gpu_check: no NVIDIA GPU here (nvidia-smi -L failed): nothing to check" >&2
  exit 77
fi
step "configuring $BUILD"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPX_WITH_CUDA=ON -DPX_BUILD_EXAMPLES=OFF > "$BUILD.configure.log" 2>&1 ||
  { tail -30 "$BUILD.configure.log"; exit 1; }
step "building the CUDA tests"
cmake --build "$BUILD" -j"$(nproc)" --target backend_test_cuda_backend backend_test_cuda_conformance \
  backend_test_cuda_gemm_layout > "$BUILD.build.log" 2>&1 || { tail -40 "$BUILD.build.log"; exit 1; }

failed=0
for t in backend_test_cuda_gemm_layout backend_test_cuda_backend backend_test_cuda_conformance; do
  step "running $t"
  if ! "$BUILD/tests/$t"; then
    echo "gpu_check: $t FAILED"
    failed=1
  fi
done
step "done"
echo "gpu_check: not yet run here: training on cuda (attention has no CUDA kernel, no NCCL communicator),"
echo "gpu_check: DDP over GPUs, tokens/s and MFU against torch.compile (docs/gpu.md)"
exit "$failed"
