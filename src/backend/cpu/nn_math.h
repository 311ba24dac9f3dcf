// Explicit 8-lane f32 math on GCC vector extensions (one code path; AVX2 with -march=native,
// SSE otherwise): exp, tanh, erf, and row helpers. GCC 12 does not auto-vectorize these
// formulas (selects next to bit casts defeat it), so they are written on vectors directly.
// Accuracy: exp a few ulp; tanh, erf ~2e-7 absolute.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace px::cpu::vmath {

using V8 = float __attribute__((vector_size(32)));
using I8 = int32_t __attribute__((vector_size(32)));

inline V8 load8(const float* p) {
  V8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store8(float* p, V8 v) { std::memcpy(p, &v, sizeof v); }
inline V8 splat(float f) { return V8{} + f; }
inline V8 select(I8 mask, V8 a, V8 b) { return mask ? a : b; }
inline V8 vmax(V8 a, V8 b) { return a > b ? a : b; }
inline V8 vabs(V8 x) { return (V8)((I8)x & 0x7fffffff); }
inline V8 copysign(V8 mag, V8 sign) {
  return (V8)(((I8)mag & 0x7fffffff) | ((I8)sign & static_cast<int32_t>(0x80000000u)));
}
inline float hsum(V8 v) { return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7])); }
inline float hmax(V8 v) {
  float m = v[0];
  for (int i = 1; i < 8; ++i) m = v[i] > m ? v[i] : m;
  return m;
}

// exp(x) by Cody-Waite reduction x = n ln2 + r and a degree-6 polynomial for exp(r); exactly
// 0 below -87.3 (so masked -inf entries vanish), inf above 88.7, NaN for NaN.
inline V8 exp(V8 x) {
  const float hi = 88.3762626647949f, lo = -87.3365447504f;
  V8 xc = x > hi ? splat(hi) : x;
  xc = xc < lo ? splat(lo) : xc;
  V8 n = xc * 1.44269504088896341f + 12582912.0f;  // adding 1.5 * 2^23 rounds to nearest
  n = n - 12582912.0f;
  V8 r = xc - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V8 p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  I8 e = (__builtin_convertvector(n, I8) + 127) << 23;
  V8 res = p * (V8)e;
  res = x < lo ? splat(0.0f) : res;
  res = x > 88.72283905f ? splat(INFINITY) : res;
  return x == x ? res : x;
}

// tanh(x) = sign(x) (1 - 2 / (exp(2|x|) + 1)), with a cubic Taylor form near 0 where the
// formula cancels; exactly +-1 beyond |x| = 20.
inline V8 tanh(V8 x) {
  V8 a = vabs(x);
  a = a > 20.0f ? splat(20.0f) : a;
  V8 t = 1.0f - 2.0f / (vmath::exp(2.0f * a) + 1.0f);
  V8 small = a - a * a * a * (1.0f / 3.0f);
  t = a < 4e-3f ? small : t;
  return copysign(t, x);
}

// erfc(a) for a >= 0 by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), without the
// cancellation that 1 - erf(a) would suffer.
inline V8 erfc_pos(V8 a) {
  V8 t = 1.0f / (1.0f + 0.3275911f * a);
  V8 y = splat(1.061405429f);
  y = y * t - 1.453152027f;
  y = y * t + 1.421413741f;
  y = y * t - 0.284496736f;
  y = y * t + 0.254829592f;
  return y * t * vmath::exp(-a * a);
}

inline V8 erf(V8 x) { return copysign(1.0f - erfc_pos(vabs(x)), x); }

// The standard normal CDF, accurate in both tails' absolute terms.
inline V8 phi(V8 x) {
  V8 half_tail = 0.5f * erfc_pos(vabs(x) * 0.7071067811865476f);
  return x < 0.0f ? half_tail : 1.0f - half_tail;
}

inline V8 sigmoid(V8 x) { return 1.0f / (1.0f + vmath::exp(-x)); }

// y[i] = f(x[i]) over n elements, 8 at a time (the tail goes through a padded block).
template <class F>
inline void map(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) store8(y + i, f(load8(x + i)));
  if (i < n) {
    float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    V8 r = f(load8(buf));
    std::memcpy(y + i, &r, static_cast<size_t>(n - i) * sizeof(float));
  }
}

inline float row_sum(const float* x, int64_t n) {
  V8 acc = splat(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load8(x + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

inline float row_max(const float* x, int64_t n) {
  V8 acc = splat(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = vmax(load8(x + i), acc);
  float m = hmax(acc);
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum(exp(x - m)), storing the exponentials into y when y is not null.
inline float exp_shift_sum(const float* x, float m, float* y, int64_t n) {
  V8 acc = splat(0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 e = vmath::exp(load8(x + i) - m);
    if (y) store8(y + i, e);
    acc += e;
  }
  float s = hsum(acc);
  if (i < n) {
    float buf[8];
    for (int k = 0; k < 8; ++k) buf[k] = i + k < n ? x[i + k] - m : -INFINITY;
    V8 e = vmath::exp(load8(buf));
    for (int64_t k = 0; i + k < n; ++k) {
      if (y) y[i + k] = e[k];
      s += e[k];
    }
  }
  return s;
}

}  // namespace px::cpu::vmath

#pragma GCC diagnostic pop
