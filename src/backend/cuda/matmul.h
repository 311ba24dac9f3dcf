// dot_general on the CUDA backend: one cuBLASLt matmul per node (a strided batched GEMM,
// gemm_layout.h), f32, bf16 and f16 operands with f32 accumulation (f32 exact; TF32 with
// PX_CUDA_TF32=1), queued on
// the device's compute stream. cuBLASLt is loaded when the first such kernel is made (dlopen of
// the toolkit's libcublasLt), so a build or a process without a GPU never loads it.
//
// NEVER RUN, as the rest of the backend (backend.h); the layout it hands cuBLASLt is checked on
// the CPU (tests/backend/test_cuda_gemm_layout.cc).
#pragma once

#include "parallax/backend.h"
#include "parallax/graph.h"

namespace px::cuda {

// The kernel of dot_general node n of g on CUDA device `device`, queued on `stream` (a
// cudaStream_t). Throws px::InternalError naming the shapes when the operands do not form one
// strided batched GEMM or cuBLASLt has no algorithm for it, px::Error when cuBLASLt is missing.
Kernel matmul_kernel(const Graph& g, const Node& n, int device, void* stream);

}  // namespace px::cuda
