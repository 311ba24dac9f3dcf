// The reference backend (platform `ref`): every primitive as plain, single-threaded C++ loops
// written from the primitive's definition (src/ops/, docs/ir.md), sharing no code with the CPU
// backend's kernels. Slow and simple on purpose: tests/backend/test_conformance.cc checks every
// primitive of the CPU backend against it, and a model trains on ref:N as on cpu:N.
//
// Values are computed in double and rounded to the result's dtype (through f32 to bf16 and f16,
// to nearest even); integer and boolean results are exact. A kernel factory sees the node's types and
// attributes once and returns a Kernel that runs on raw buffers.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "parallax/backend.h"
#include "parallax/graph.h"

namespace px::ref {

struct Spec {
  const std::vector<TensorType>& in;
  const std::vector<TensorType>& out;
  const Attrs& attrs;
};
using Factory = std::function<Kernel(const Spec&)>;

// Kernels by primitive (its handle, src/ops/prims.h; a node's `prim`); throws when the primitive
// has one already. A primitive registered above the backends (src/sharding's local_slice,
// sharding_constraint) is added by a getter that returns null until it is registered
// (src/backend/kernel_table.h).
void register_kernel(const Primitive* primitive, Factory f);
void register_late_kernel(const Primitive* (*handle)(), Factory f);
// A family's kernels at once; and a factory with a flag as two kernels, `off` getting it false
// and `on` true (softmax and log_softmax, layer_norm and rms_norm, ...).
void register_kernels(std::initializer_list<std::pair<const Primitive*, Factory>> kernels);
void register_kernel_pair(const Primitive* off, const Primitive* on, Kernel (*f)(const Spec&, bool));
const Factory* find_kernel(const Primitive* primitive);  // nullptr when none

// Element i of a buffer of dtype t, as a double (bool: 0 or 1); and a double stored to element i
// (rounded to nearest even for bf16 and f16; i32 truncates toward zero and saturates, NaN gives 0;
// bool: != 0).
double load(const void* p, DType t, int64_t i);
void store(void* p, DType t, int64_t i, double v);

// Row-major strides of a shape (elements).
std::vector<int64_t> strides_of(const std::vector<int64_t>& shape);

// Discrete device memory (PX_REF_DISCRETE=1, discrete.cc): device buffers the host cannot touch
// except inside a DeviceAccess, which the backend's kernels and copies open around their work.
bool discrete();
void* discrete_allocate(int64_t bytes);  // nullptr when out of memory
void discrete_free(void* p);
bool is_device_buffer(const void* p);
// Opens the device buffers that hold these pointers (host pointers and null are ignored) for
// reading and writing until it is destroyed.
class DeviceAccess {
 public:
  DeviceAccess(std::initializer_list<const void*> pointers);
  DeviceAccess(const void* const* in, size_t n_in, const void* const* out, size_t n_out);
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  void open(const void* p);
  std::vector<uintptr_t> opened_;
};

// The kernel families, each in its own file.
void register_elementwise_kernels();  // elementwise.cc
void register_shape_kernels();        // shape.cc: reshape, transpose, broadcast, slice, pad, concat, ...
void register_reduce_kernels();       // reduce.cc
void register_index_kernels();        // index.cc: take, scatter_add, one_hot
void register_matmul_kernels();       // matmul.cc: dot_general
void register_nn_kernels();           // nn.cc: softmax, norms, cross-entropy, gelu, silu, attention
void register_optim_kernels();        // optim.cc: adamw_update
void register_rng_kernels();          // rng.cc: random_uniform, random_normal, fold_in

Backend& backend();

}  // namespace px::ref
