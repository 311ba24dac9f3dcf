// Small helpers shared by the CPU kernel families: splitting a loop over threads, and a scalar
// attribute as the bytes of one element.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/kernel.h"

namespace px::cpu {

// Runs f(begin, end) over [0, n) split into contiguous ranges, one per thread, when the total work
// (`work_total` in any unit, `work_per_thread` of it at least per thread) makes threads worth waking.
template <class F>
void parallel_ranges(int64_t n, int64_t work_total, int64_t work_per_thread, F&& f) {
  if (n <= 0) return;
  const int64_t chunks = std::min<int64_t>({num_threads(), n, std::max<int64_t>(1, work_total / work_per_thread)});
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t b = n * t / nt, e = n * (t + 1) / nt;
    if (b < e) f(b, e);
  }
}

// The bytes of `v` as one element of dtype `d` (at most 4); i32 saturates, NaN gives 0.
inline uint32_t element_bits(double v, DType d) {
  uint32_t bits = 0;
  switch (d) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(&bits, &f, 4);
      break;
    }
    case DType::bf16: bits = f32_to_bf16(static_cast<float>(v)); break;
    case DType::f16: bits = f32_to_f16(static_cast<float>(v)); break;
    case DType::i32: {
      const double c = std::isnan(v) ? 0.0 : std::clamp(v, -2147483648.0, 2147483647.0);
      bits = static_cast<uint32_t>(static_cast<int32_t>(c));
      break;
    }
    case DType::boolean: bits = v != 0.0; break;
  }
  return bits;
}

}  // namespace px::cpu
