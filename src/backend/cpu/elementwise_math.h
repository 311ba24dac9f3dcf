// Branch-free float approximations of exp, log, tanh and sigmoid (a few ulp) that GCC
// vectorizes when inlined into plain loops; libm calls would run one element at a time.
//
//   for (int64_t i = 0; i < n; ++i) y[i] = px::cpu::eltmath::exp(x[i]);
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

namespace px::cpu::eltmath {

// Fused multiply-add where the target has it (a single instruction), plain otherwise.
inline float fmadd(float a, float b, float c) {
#ifdef __FMA__
  return __builtin_fmaf(a, b, c);
#else
  return a * b + c;
#endif
}

// c ? a : b as bit masks. Both operands are computed anyway; a plain ?: lets GCC sink a
// trapping float operation into a branch, which (under -ftrapping-math) blocks vectorization.
inline float select(bool c, float a, float b) {
  int32_t m = -static_cast<int32_t>(c);
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & m) | (std::bit_cast<int32_t>(b) & ~m));
}

inline float exp(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693115234375f;  // 12 significant bits: n * kLn2Hi is exact
  constexpr float kLn2Lo = 3.194618494528623e-05f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  // Beyond these bounds the result is inf or 0 anyway; clamping keeps n in range.
  float xc = x < -104.0f ? -104.0f : x;
  xc = xc > 89.0f ? 89.0f : xc;
  float t = fmadd(xc, kLog2e, kRound);
  float nf = t - kRound;
  float r = fmadd(nf, -kLn2Hi, xc);
  r = fmadd(nf, -kLn2Lo, r);
  // e^r on |r| <= ln2/2 by its Taylor series to r^7 (truncation < 1e-8 relative).
  float p = 1.0f / 5040;
  p = fmadd(p, r, 1.0f / 720);
  p = fmadd(p, r, 1.0f / 120);
  p = fmadd(p, r, 1.0f / 24);
  p = fmadd(p, r, 1.0f / 6);
  p = fmadd(p, r, 0.5f);
  p = fmadd(p, r, 1.0f);
  p = fmadd(p, r, 1.0f);
  // 2^n as two factors so that n in [-150, 128] needs no denormal or infinite scale.
  int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  int32_t n1 = n >> 1, n2 = n - n1;
  float s1 = std::bit_cast<float>((n1 + 127) << 23);
  float s2 = std::bit_cast<float>((n2 + 127) << 23);
  float y = p * s1 * s2;
  return select(x != x, x, y);
}

inline float log(float x) {
  constexpr float kLn2Hi = 0.693115234375f;
  constexpr float kLn2Lo = 3.194618494528623e-05f;
  constexpr float kSqrt2 = 1.41421356237f;
  // Denormals: scale into the normal range first.
  bool tiny = x < std::numeric_limits<float>::min();
  float xs = select(tiny, x * 8388608.0f, x);  // 2^23
  int32_t u = std::bit_cast<int32_t>(xs);
  int32_t e = ((u >> 23) & 0xff) - 127 - (tiny ? 23 : 0);
  float m = std::bit_cast<float>((u & 0x007fffff) | 0x3f800000);  // [1, 2)
  bool big = m > kSqrt2;
  m = select(big, m * 0.5f, m);
  e = big ? e + 1 : e;
  // log(1 + f) = 2 atanh(s) with s = f / (2 + f), |s| <= 0.172: odd series to s^11.
  float f = m - 1.0f;
  float s = f / (2.0f + f);
  float z = s * s;
  float q = 1.0f / 11;
  q = fmadd(q, z, 1.0f / 9);
  q = fmadd(q, z, 1.0f / 7);
  q = fmadd(q, z, 1.0f / 5);
  q = fmadd(q, z, 1.0f / 3);
  float rz = q * z;
  // f - s (f - 2 R) keeps f exact and puts the rounding in a term 5x smaller than f.
  float lg = f - s * fmadd(-2.0f, rz, f);
  float ef = static_cast<float>(e);
  float y = fmadd(ef, kLn2Hi, fmadd(ef, kLn2Lo, lg));
  constexpr float kInf = std::numeric_limits<float>::infinity();
  y = select(x < 0.0f, std::numeric_limits<float>::quiet_NaN(), y);
  y = select(x == 0.0f, -kInf, y);
  y = select(x == kInf, kInf, y);
  return select(x != x, x, y);
}

inline float tanh(float x) {
  float ax = std::fabs(x);
  // Small |x|: odd Taylor series to x^17 (next term < 1e-9 relative at 0.5).
  float z = x * x;
  float p = 6404582.0f / 10854718875.0f;
  p = fmadd(p, z, -929569.0f / 638512875.0f);
  p = fmadd(p, z, 21844.0f / 6081075.0f);
  p = fmadd(p, z, -1382.0f / 155925.0f);
  p = fmadd(p, z, 62.0f / 2835.0f);
  p = fmadd(p, z, -17.0f / 315.0f);
  p = fmadd(p, z, 2.0f / 15.0f);
  p = fmadd(p, z, -1.0f / 3.0f);
  float small = fmadd(p * z, ax, ax);
  // Otherwise 1 - 2 / (e^{2|x|} + 1); saturates to 1 through e^{2|x|} = inf.
  float large = 1.0f - 2.0f / (exp(2.0f * ax) + 1.0f);
  return std::copysign(select(ax < 0.5f, small, large), x);
}

// With e = e^{-|x|} <= 1 both branches avoid overflow, so tiny results keep their precision.
inline float sigmoid(float x) {
  float e = exp(-std::fabs(x));
  float r = 1.0f / (1.0f + e);
  return select(x >= 0.0f, r, e * r);
}

}  // namespace px::cpu::eltmath
