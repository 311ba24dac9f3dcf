// Kernel tables (by primitive handle) and dtype conversions shared by every CPU kernel family.
#include <omp.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/dnnl/dnnl.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/kernel_table.h"
#include "core/env.h"

namespace px::cpu {

namespace {
// Kernels may be registered while other threads compile (KernelTable locks).
KernelTable<KernelFactory>& kernels() {
  static KernelTable<KernelFactory> t("cpu");
  return t;
}
KernelTable<ScratchSize>& scratch_sizes() {
  static KernelTable<ScratchSize> t("cpu scratch");
  return t;
}
KernelTable<EltwiseKernel>& eltwise() {
  static KernelTable<EltwiseKernel> t("cpu elementwise");
  return t;
}

// Factories size their scratch from the shapes: running out of memory there is a px::Error
// naming the op and its types, not a bare std::bad_alloc.
KernelFactory checked(const std::string& prim, KernelFactory f) {
  return [prim, f = std::move(f)](const KernelSpec& spec) -> Kernel {
    try {
      return f(spec);
    } catch (const std::bad_alloc&) {
      std::vector<std::string> types;
      for (const TensorType& t : spec.out) types.push_back(type_str(t));
      throw UserError(fmt::format("[compile] out of host memory preparing the '{}' kernel for {}; use smaller shapes",
                                  prim, fmt::join(types, ", ")));
    }
  };
}
}  // namespace

void register_kernel(const Primitive* prim, KernelFactory f) {
  kernels().add(prim, checked(prim ? prim->name : std::string(), std::move(f)));
}

void register_kernel(const Primitive* prim, KernelFactory f, ScratchSize scratch) {
  register_kernel(prim, std::move(f));
  scratch_sizes().add(prim, std::move(scratch));
}

int64_t scratch_bytes(const Primitive* prim, const KernelSpec& spec) {
  register_all_kernels();
  const ScratchSize* f = scratch_sizes().find(prim);
  return f ? (*f)(spec) : 0;
}

void register_late_kernel(const Primitive* (*handle)(), KernelFactory f) {
  kernels().add_late(handle, [handle, f = std::move(f)](const KernelSpec& spec) -> Kernel {
    return checked(handle()->name, f)(spec);
  });
}

void register_kernels(std::initializer_list<std::pair<const Primitive*, KernelFactory>> kernels) {
  for (const auto& [prim, f] : kernels) register_kernel(prim, f);
}

void register_kernel_pair(const Primitive* off, const Primitive* on, Kernel (*f)(const KernelSpec&, bool)) {
  register_kernel(off, [f](const KernelSpec& s) { return f(s, false); });
  register_kernel(on, [f](const KernelSpec& s) { return f(s, true); });
}

void register_eltwise(const Primitive* prim, EltwiseKernel k) { eltwise().add(prim, std::move(k)); }

void register_all_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    apply_thread_settings();
    register_elementwise_kernels();
    register_shape_kernels();
    register_reduce_kernels();
    register_matmul_kernels();
    register_nn_kernels();
    register_optim_kernels();
    register_index_kernels();
    register_rng_kernels();
  });
}

const KernelFactory* find_kernel(const Primitive* prim) {
  register_all_kernels();
  return kernels().find(prim);
}

const EltwiseKernel* find_eltwise(const Primitive* prim) {
  register_all_kernels();
  return eltwise().find(prim);
}

void sgemm(std::atomic<int>& err, char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f)
      for (int64_t i = 0; i < m; ++i) std::memset(c + i * ldc, 0, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  dnnl_status_t st = dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (st != dnnl_success) {
    int expected = 0;
    err.compare_exchange_strong(expected, static_cast<int>(st));
  }
}

void throw_if_sgemm_failed(std::atomic<int>& err, const char* op) {
  int st = err.exchange(0);
  if (st != 0)
    throw InternalError(fmt::format("[cpu] {}: dnnl_sgemm failed with oneDNN status {}; its result is not valid", op,
                                    st));
}

void load_f32(const void* src, DType t, int64_t offset, float* dst, int64_t n) {
  switch (t) {
    case DType::f32: {
      const float* s = static_cast<const float*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i];
      break;
    }
    case DType::bf16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u = static_cast<uint32_t>(s[i]) << 16;
        std::memcpy(dst + i, &u, 4);
      }
      break;
    }
    case DType::f16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      int64_t i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      break;
    }
    case DType::i32: {
      const int32_t* s = static_cast<const int32_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
      break;
    }
    case DType::boolean: {
      const uint8_t* s = static_cast<const uint8_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i] ? 1.0f : 0.0f;
      break;
    }
  }
}

void stream_f32(const float* src, float* dst, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = src[i];
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
#elif defined(__AVX__)
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
#endif
  for (; i < n; ++i) dst[i] = src[i];
}

void stream_bf16(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = bf16_bits(src[i]);
  // A line at a time: rounded into an aligned buffer (the fixed-length loop vectorizes), then written.
  alignas(64) uint16_t line[32];
  for (; i + 32 <= n; i += 32) {
    for (int k = 0; k < 32; ++k) line[k] = bf16_bits(src[i + k]);
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i), _mm512_load_si512(line));
  }
#endif
  for (; i < n; ++i) dst[i] = bf16_bits(src[i]);
}

void store_f32(const float* src, void* dst, DType t, int64_t offset, int64_t n) {
  switch (t) {
    case DType::f32: {
      float* d = static_cast<float*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      break;
    }
    case DType::bf16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits(src[i]);
      break;
    }
    case DType::f16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      int64_t i = 0;
#ifdef __F16C__
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
#endif
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
      break;
    }
    case DType::i32: {
      int32_t* d = static_cast<int32_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int32_t>(src[i]);
      break;
    }
    case DType::boolean: {
      uint8_t* d = static_cast<uint8_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i] != 0.0f;
      break;
    }
  }
}

void convert(const void* src, DType src_t, void* dst, DType dst_t, int64_t n) {
  if (src_t == dst_t) {
    std::memcpy(dst, src, static_cast<size_t>(n * dtype_size(src_t)));
    return;
  }
  if (src_t == DType::i32 && dst_t == DType::boolean) {
    for (int64_t i = 0; i < n; ++i) static_cast<uint8_t*>(dst)[i] = static_cast<const int32_t*>(src)[i] != 0;
    return;
  }
  if (src_t == DType::boolean && dst_t == DType::i32) {
    for (int64_t i = 0; i < n; ++i) static_cast<int32_t*>(dst)[i] = static_cast<const uint8_t*>(src)[i];
    return;
  }
  float buf[256];
  for (int64_t off = 0; off < n; off += 256) {
    int64_t len = std::min<int64_t>(256, n - off);
    load_f32(src, src_t, off, buf, len);
    store_f32(buf, dst, dst_t, off, len);
  }
}

int num_threads() {
  apply_thread_settings();
  return omp_get_max_threads();
}

}  // namespace px::cpu
