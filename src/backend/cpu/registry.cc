// Kernel tables and dtype conversions shared by every CPU kernel family.
#include <omp.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#include <cstring>
#include <mutex>
#include <unordered_map>

#include "backend/cpu/kernel.h"
#include "core/env.h"

namespace px::cpu {

namespace {
std::unordered_map<std::string, KernelFactory>& kernels() {
  static std::unordered_map<std::string, KernelFactory> t;
  return t;
}
std::unordered_map<std::string, EltwiseKernel>& eltwise() {
  static std::unordered_map<std::string, EltwiseKernel> t;
  return t;
}
}  // namespace

void register_kernel(const std::string& prim, KernelFactory f) {
  if (!kernels().emplace(prim, std::move(f)).second) throw Error("[cpu] kernel '" + prim + "' registered twice");
}

void register_eltwise(const std::string& prim, EltwiseKernel k) {
  if (!eltwise().emplace(prim, std::move(k)).second)
    throw Error("[cpu] elementwise kernel '" + prim + "' registered twice");
}

void register_all_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    apply_thread_settings();
    register_elementwise_kernels();
    register_shape_kernels();
    register_reduce_kernels();
    register_matmul_kernels();
    register_nn_kernels();
    register_index_kernels();
    register_rng_kernels();
  });
}

const KernelFactory* find_kernel(const std::string& prim) {
  register_all_kernels();
  auto it = kernels().find(prim);
  return it == kernels().end() ? nullptr : &it->second;
}

const EltwiseKernel* find_eltwise(const std::string& prim) {
  register_all_kernels();
  auto it = eltwise().find(prim);
  return it == eltwise().end() ? nullptr : &it->second;
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

void store_f32(const float* src, void* dst, DType t, int64_t offset, int64_t n) {
  switch (t) {
    case DType::f32: {
      float* d = static_cast<float*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = src[i];
      break;
    }
    case DType::bf16: {
      // Round to nearest even, branch-free so that it vectorizes; NaNs stay (quiet) NaNs.
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, src + i, 4);
        uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
        uint32_t nan = (u >> 16) | 0x40u;
        d[i] = static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
      }
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
