// The CUDA backend's kernel generator: CUDA C source for one unit of a schedule (a single node, or
// a fused elementwise group as the schedule forms them), compiled at run time by NVRTC
// (nvrtc.cc). Host code only: it needs no GPU, and tests/backend/test_cuda_codegen.cc compiles
// everything it emits for sm_80 and sm_90.
//
// Every kernel is one `extern "C" __global__` function whose parameters are the unit's buffers in
// order, operands then results (`const T*` then `T*`, T the dtype's storage: float, unsigned short
// for bf16 and f16, int, unsigned char for bool); shapes and attributes are constants of the source,
// so a source is specialized to its types and a cache keyed by its hash finds it again. bf16 and
// f16 values are computed in f32; the element math is src/backend/element_math.h, included as
// "px_element_math.h" (its text: element_math_text()).
//
// Families: elementwise nodes and fused groups (the elementwise primitives, gelu, gelu_grad,
// silu, broadcast_in_dim of an operand read as a strided load, reshape as a rename), full, iota;
// reduce_sum and reduce_max; softmax and log_softmax; layer_norm and rms_norm and their
// gradients; softmax_cross_entropy and its gradient; take, scatter_add and one_hot; adamw_update;
// random_uniform, random_normal and fold_in; transpose, slice, pad and concat. Matmuls and
// attention are left to cuBLASLt and cuDNN; constants are data, copied to the device.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parallax/backend.h"
#include "parallax/graph.h"

namespace px::cuda {

// The name generated sources include the element math by, and the header's text (embedded at
// configure time from src/backend/element_math.h).
inline constexpr const char* kElementMathInclude = "px_element_math.h";
const char* element_math_text();

// How a kernel is launched: a grid of `blocks` blocks of `threads` threads (row kernels run one
// block per row; elementwise kernels a grid-stride loop over `blocks` blocks).
struct Launch {
  int64_t blocks = 1;
  int threads = 256;
};

struct KernelSource {
  std::string name;    // the __global__ function, px_<family>_<hash of the source>
  std::string source;  // the CUDA C translation unit
  std::string label;   // what it computes, for messages: "fused{mul,exp} bf16[4,8]"
  Launch launch;
  int num_inputs = 0, num_outputs = 0;  // its parameters: inputs, then outputs
  bool zero_outputs = false;            // the launcher zeroes the results first (atomic sums)
};

// Whether node n can join a generated elementwise kernel (a CUDA backend's can_fuse).
bool can_generate_elementwise(const Graph& g, const Node& n);
// Whether generate() has a kernel for nodes of this primitive (a CUDA backend's has_kernel, for
// the primitives it does not run through a library).
bool can_generate(const Primitive* primitive);

// The kernel of one compute unit (Unit::Kind::kernel or fused). Throws px::Error naming the
// primitive when the generator has no kernel for it.
KernelSource generate(const Graph& g, const Unit& unit);

}  // namespace px::cuda
