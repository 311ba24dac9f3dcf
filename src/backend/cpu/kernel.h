// CPU kernels, keyed by primitive (its handle, src/ops/prims.h; a node's `prim`). A factory sees
// the node's types and attributes once, at compile time, precomputes what it can, and returns a
// Kernel that runs every step on raw buffers without allocating or throwing. Parallel loops use
// OpenMP (shared with oneDNN), so the total number of compute threads is the number of cores.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "parallax/graph.h"

namespace px::cpu {

struct KernelSpec {
  const std::vector<TensorType>& in;
  const std::vector<TensorType>& out;
  const Attrs& attrs;
};
using Kernel = std::function<void(const void* const* in, void* const* out)>;
using KernelFactory = std::function<Kernel(const KernelSpec&)>;

// Working memory of a kernel, in bytes for its spec (0: none). The runtime plans it with the
// program's buffers (Backend::scratch_bytes) and hands it to the kernel after its results, at
// out[spec.out.size()]: 64-byte aligned, live only while the kernel runs, so a step allocates
// nothing outside its plan. A factory that uses it registers the size with it, both computed from
// one plan of the spec so that they agree.
using ScratchSize = std::function<int64_t(const KernelSpec&)>;

// Throws px::Error when the primitive has a kernel already.
void register_kernel(const Primitive* prim, KernelFactory f);
void register_kernel(const Primitive* prim, KernelFactory f, ScratchSize scratch);
int64_t scratch_bytes(const Primitive* prim, const KernelSpec& spec);  // 0 where none is registered
// A kernel's scratch (out[results]) as T*.
template <class T = float>
T* scratch_of(void* const* out, size_t results) {
  return static_cast<T*>(out[results]);
}
// Parts of one kernel's scratch, each starting a cache line: add(bytes) returns the part's offset.
struct ScratchLayout {
  int64_t bytes = 0;
  int64_t add(int64_t n) {
    const int64_t at = bytes;
    bytes += (std::max<int64_t>(n, 0) + 63) / 64 * 64;
    return at;
  }
  int64_t add_floats(int64_t n) { return add(n * static_cast<int64_t>(sizeof(float))); }
};
// A primitive registered above the backends (src/sharding's local_slice, sharding_constraint), by
// a getter that returns null until it is registered (src/backend/kernel_table.h).
void register_late_kernel(const Primitive* (*handle)(), KernelFactory f);
// A family's kernels at once; and a factory with a flag as two kernels, `off` getting it false
// and `on` true (softmax and log_softmax, layer_norm and rms_norm, ...).
void register_kernels(std::initializer_list<std::pair<const Primitive*, KernelFactory>> kernels);
void register_kernel_pair(const Primitive* off, const Primitive* on, Kernel (*f)(const KernelSpec&, bool));
const KernelFactory* find_kernel(const Primitive* prim);  // nullptr when none

// Elementwise primitives register block functions instead; the fused-loop engine chains them
// over cache-sized tiles. Operands arrive converted to f32 (bool as 0/1) and results are
// converted to the result dtype on store. `params` come from EltwiseKernel::params(attrs).
using EltwiseF32 = void (*)(const float* const* in, float* out, int64_t n, const float* params);
// Exact integer path, used when every operand is i32 or bool (never fused).
using EltwiseI32 = void (*)(const int32_t* const* in, int32_t* out, int64_t n, const float* params);
struct EltwiseKernel {
  EltwiseF32 f32 = nullptr;
  EltwiseI32 i32 = nullptr;
  std::function<std::vector<float>(const Attrs&)> params;  // optional
};
void register_eltwise(const Primitive* prim, EltwiseKernel k);
const EltwiseKernel* find_eltwise(const Primitive* prim);  // nullptr when none

// One fused loop: `nodes` are elementwise nodes of `g` in schedule order, all with results of
// `numel` elements. `ext_inputs` are the values read from outside the group and `ext_outputs`
// the values that must be written out; the kernel's operand/result buffers follow that order.
struct FusedGroup {
  std::vector<int> nodes;
  std::vector<int> ext_inputs;
  std::vector<int> ext_outputs;
};
Kernel make_fused_kernel(const Graph& g, const FusedGroup& group);
int64_t fused_scratch_bytes(const Graph& g, const FusedGroup& group);  // its tiles and slot tables

// Registers every CPU kernel family (called once by the runtime).
void register_all_kernels();
void register_elementwise_kernels();
void register_shape_kernels();
void register_reduce_kernels();
void register_matmul_kernels();
void register_nn_kernels();
void register_optim_kernels();
void register_index_kernels();
void register_rng_kernels();

// Copies between dtypes element by element (used by cast and by loads/stores).
void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n);
void load_f32(const void* src, DType t, int64_t offset, float* dst, int64_t n);
void store_f32(const float* src, void* dst, DType t, int64_t offset, int64_t n);
// Copies with non-temporal stores (no read of the destination's lines, no cache pollution): for
// results too large to be read back from cache. Callers fence (_mm_sfence) before others read.
void stream_f32(const float* src, float* dst, int64_t n);
// The same into bf16 (rounded as store_f32 rounds): whole 64-byte lines written past the cache.
void stream_bf16(const float* src, uint16_t* dst, int64_t n);
// One f32 as bf16 bits: round to nearest even, branch-free so that loops of it vectorize; NaNs
// stay (quiet) NaNs.
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

int num_threads();

// Runs body(i) for every i in [0, n): split statically over up to `threads` OpenMP threads when
// `parallel`, else in the calling thread without entering an OpenMP region (libgomp allocates a
// thread team even for a region whose `if` clause is false, so small kernels would allocate on
// every call).
template <class Body>
void parallel_rows(int64_t n, int threads, bool parallel, const Body& body) {
  if (!parallel || threads <= 1 || n <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

// Row-major dnnl_sgemm that tolerates empty products (C = beta C when k is 0) and records a
// failing status in `err` (safe inside OpenMP regions, where nothing may throw).
void sgemm(std::atomic<int>& err, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// After the parallel region: throws px::InternalError naming `op` when an sgemm failed (and clears it),
// so a failed product is never a silently wrong result.
void throw_if_sgemm_failed(std::atomic<int>& err, const char* op);

}  // namespace px::cpu
