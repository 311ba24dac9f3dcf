// Vector f32 transcendentals for the elementwise block functions that the fused-loop engine
// chains and for the row kernels (softmax, cross entropy, the norms, attention): exp, log, tanh,
// sigmoid, erf, erfc and the normal CDF, and row sums, maxima and exp-sums, written once on GCC
// vector extensions at the widest width the build targets (16 lanes with AVX-512, 8 with AVX, else 4).
// Every lane runs the same operations, so a value's result does not depend on its position: a
// tail goes through a padded vector, and `vecmath::scalar(f, x)` is the same function on one float.
// With AVX-512, 2^n scaling (vscalefps), blends, clamps and divisions (a reciprocal refined by
// FMAs) take AVX-512 instructions; other targets run the same formulas with IEEE division, so
// their results may differ in the last bit.
//
//   vecmath::map(x, y, n, [](vecmath::V v) { return vecmath::exp(v); });
//
// Accuracy: the error against the exact value (libm in double precision), in units of the last
// place of the result's binade, over about 20M inputs per function (every 251st float bit pattern
// of both signs, dense sweeps of [-12, 12] and of small magnitudes, subnormals, 40k floats around
// each point where a formula switches) and at the special values (0, -0, +-inf, NaN, the smallest
// subnormal, FLT_MAX), asserted by tests/backend/test_vmath.cc (measured maximum in brackets; the
// same on an AVX2 + FMA build; without FMA exp reaches 1.2 ulp, the others stay within them):
//
//   exp      <= 1 ulp (0.92); subnormal results <= 2 ulp of 2^-149 (0.79); 0 at -104 and below,
//            inf at 89 and above (and from 88.73 on, where the exact value rounds to inf), NaN for NaN.
//   log      <= 1 ulp (0.91) for x > 0, subnormals included; -inf at +-0, NaN below 0, inf at inf.
//   tanh     <= 2 ulp (1.87; 1.94 over every float in [1e-4, 9.2)); tanh(-0) = -0, +-1 from +-9.1 on.
//   sigmoid  <= 2.5 ulp (2.29); subnormal results <= 1 ulp of 2^-149 (0.77).
//   erf      <= 2 ulp (1.43); erf(-0) = -0, +-1 at +-4 and beyond.
//   erfc     <= 7 ulp (5.74) on results of at least 2^-126, the tail's polynomial limiting it.
//   phi      (the normal CDF, Phi(x) = erfc(-x / sqrt 2) / 2) <= 7 ulp (5.66), the same way;
//            gelu's erf form x Phi(x) (nn.cc) <= 7 ulp (5.29) where Phi(x) >= 2^-126 (x >= -12.9).
//   (nn.cc) gelu's tanh form x sigmoid(2u) <= 6 ulp (3.24) from x = -1 up; below, the rounding of
//            2u in float reaches the result (relative error <= 3e-5, 1.5e-5 measured; the formula's);
//            silu x sigmoid(x) <= 4 ulp (3.09).
//
// exp: Cody-Waite reduction x = n ln2 + r (ln2 in two parts, the first with 12 significant bits so
// that n * it is exact), |r| <= ln2 / 2, e^r by its Taylor series to r^7 (truncation < 6e-9), and
// 2^n applied by vscalefps with AVX-512 (one rounding), else as two factors so that n in
// [-150, 128] needs no subnormal or infinite scale (the same bits, but maybe for subnormal results).
// log: x = 2^e m with m in [sqrt(1/2), sqrt 2), log m = 2 atanh(s), s = (m - 1) / (m + 1), by
// its odd series to s^11. tanh: -m / (2 + m) with m = e^{-2|x|} - 1 from exp's reduction and
// series (e^r - 1 kept apart from the 1). erf: x (1 + R(x^2)) below |x| = 0.921875 (R of degree 5,
// fitted to the relative error of erf(x) / x - 1 by least squares on Chebyshev nodes), else
// 1 - erfc(|x|);
// erfc(a) = e^{-a^2} P(t) with t = 1 / (1 + a / 2) and P of degree 8 (fitted to erfc(a) e^{a^2}
// on [0.92, 10.1] the same way), e^{-a^2} from a^2 = h + l split exactly by an FMA, as
// e^{-h} (1 - l).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#ifdef __SSE2__
#include <immintrin.h>
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"

namespace px::cpu::vecmath {

#if defined(__AVX512F__)
constexpr int kLanes = 16;
#elif defined(__AVX__)
constexpr int kLanes = 8;
#else
constexpr int kLanes = 4;
#endif

using V = float __attribute__((vector_size(4 * kLanes)));
using I = int32_t __attribute__((vector_size(4 * kLanes)));

inline V splat(float f) { return V{} + f; }
inline I splati(int32_t i) { return I{} + i; }
inline V load(const float* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void store(float* p, V v) { std::memcpy(p, &v, sizeof v); }
inline V as_float(I i) { return reinterpret_cast<V>(i); }
inline I as_int(V v) { return reinterpret_cast<I>(v); }
// Comparisons give a mask M (a k-register with AVX-512, else all-ones lanes); all are false where
// an operand is NaN, but isnan. select(m, a, b) is m ? a : b per lane.
#if defined(__AVX512F__)
using M = __mmask16;
inline __m512 raw(V v) { return reinterpret_cast<__m512>(v); }
inline M lt(V a, V b) { return _mm512_cmp_ps_mask(raw(a), raw(b), _CMP_LT_OQ); }
inline M gt(V a, V b) { return _mm512_cmp_ps_mask(raw(a), raw(b), _CMP_GT_OQ); }
inline M ge(V a, V b) { return _mm512_cmp_ps_mask(raw(a), raw(b), _CMP_GE_OQ); }
inline M eq(V a, V b) { return _mm512_cmp_ps_mask(raw(a), raw(b), _CMP_EQ_OQ); }
inline M isnan(V a) { return _mm512_cmp_ps_mask(raw(a), raw(a), _CMP_UNORD_Q); }
inline V select(M m, V a, V b) { return reinterpret_cast<V>(_mm512_mask_blend_ps(m, raw(b), raw(a))); }
inline I selecti(M m, I a, I b) {
  return reinterpret_cast<I>(_mm512_mask_blend_epi32(m, reinterpret_cast<__m512i>(b), reinterpret_cast<__m512i>(a)));
}
// x > c ? c : x and x < c ? c : x in one instruction each (NaN x stays NaN).
inline V clamp_hi(V x, float c) { return reinterpret_cast<V>(_mm512_maskz_min_ps(0xffff, _mm512_set1_ps(c), raw(x))); }
inline V clamp_lo(V x, float c) { return reinterpret_cast<V>(_mm512_maskz_max_ps(0xffff, _mm512_set1_ps(c), raw(x))); }
#else
using M = I;
inline M lt(V a, V b) { return a < b; }
inline M gt(V a, V b) { return a > b; }
inline M ge(V a, V b) { return a >= b; }
inline M eq(V a, V b) { return a == b; }
inline M isnan(V a) { return a != a; }
inline V select(M m, V a, V b) { return as_float((as_int(a) & m) | (as_int(b) & ~m)); }
inline I selecti(M m, I a, I b) { return (a & m) | (b & ~m); }
inline V clamp_hi(V x, float c) { return select(x > c, splat(c), x); }
inline V clamp_lo(V x, float c) { return select(x < c, splat(c), x); }
#endif
inline M lt(V a, float b) { return lt(a, splat(b)); }
inline M gt(V a, float b) { return gt(a, splat(b)); }
inline M ge(V a, float b) { return ge(a, splat(b)); }
inline M eq(V a, float b) { return eq(a, splat(b)); }
inline V vabs(V x) { return as_float(as_int(x) & 0x7fffffff); }
inline V copysign(V mag, V sign) {
  return as_float((as_int(mag) & 0x7fffffff) | (as_int(sign) & static_cast<int32_t>(0x80000000u)));
}

// a * b + c, rounded once where the target has FMA.
inline V fmadd(V a, V b, V c) {
#if defined(__AVX512F__)
  return reinterpret_cast<V>(
      _mm512_fmadd_ps(reinterpret_cast<__m512>(a), reinterpret_cast<__m512>(b), reinterpret_cast<__m512>(c)));
#elif defined(__AVX__) && defined(__FMA__)
  return reinterpret_cast<V>(
      _mm256_fmadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b), reinterpret_cast<__m256>(c)));
#elif defined(__FMA__)
  return reinterpret_cast<V>(
      _mm_fmadd_ps(reinterpret_cast<__m128>(a), reinterpret_cast<__m128>(b), reinterpret_cast<__m128>(c)));
#else
  return a * b + c;
#endif
}
inline V fmadd(V a, float b, float c) { return fmadd(a, splat(b), splat(c)); }

// a / b for a finite b in [2^-100, 2^100] in magnitude (every caller's denominator is in [1, 2^27]).
// With AVX-512 a 512-bit division takes 10 cycles or more on one port: a 14-bit reciprocal, one
// Newton step and a residual correction (all FMAs) give the quotient to within about 0.5 ulp
// (correctly rounded but in rare ties) in a third of that; elsewhere the IEEE division.
inline V div(V a, V b) {
#if defined(__AVX512F__)
  const __m512 bv = reinterpret_cast<__m512>(b);
  V y = reinterpret_cast<V>(_mm512_mask_rcp14_ps(bv, 0xffff, bv));
  y = fmadd(fmadd(-b, y, splat(1.0f)), y, y);
  V q = a * y;
  V r = fmadd(-q, b, a);
  return fmadd(r, y, q);
#else
  return a / b;
#endif
}

// a / (b + c) for b as div's and |c| below half an ulp of b: the residual of the quotient is
// taken against both parts.
inline V div2(V a, V b, V c) {
#if defined(__AVX512F__)
  const __m512 bv = reinterpret_cast<__m512>(b);
  V y = reinterpret_cast<V>(_mm512_mask_rcp14_ps(bv, 0xffff, bv));
  y = fmadd(fmadd(-b, y, splat(1.0f)), y, y);
  V q = a * y;
  V r = fmadd(-q, c, fmadd(-q, b, a));
  return fmadd(r, y, q);
#else
  V q = a / b;
  V r = fmadd(-q, c, fmadd(-q, b, a));
  return q + r / b;
#endif
}

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693115234375f;  // 12 significant bits: n * kLn2Hi is exact
constexpr float kLn2Lo = 3.194618494528623e-05f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer

// exp's range reduction, x = n ln2 + r with |r| <= ln2 / 2: t = n + kRound (n in its low bits),
// nf = n as a float.
struct ExpReduced {
  V t, nf, r;
};
inline ExpReduced exp_reduce(V x) {
  V t = fmadd(x, kLog2e, kRound);
  V nf = t - kRound;
  V r = fmadd(nf, splat(-kLn2Hi), x);
  return {t, nf, fmadd(nf, splat(-kLn2Lo), r)};
}

// (e^r - 1 - r) / r^2 by its Taylor series to the r^5 / 7! term.
inline V exp_series(V r) {
  V p = splat(1.0f / 5040);
  p = fmadd(p, r, splat(1.0f / 720));
  p = fmadd(p, r, splat(1.0f / 120));
  p = fmadd(p, r, splat(1.0f / 24));
  p = fmadd(p, r, splat(1.0f / 6));
  return fmadd(p, r, splat(0.5f));
}

inline V exp(V x) {
  // Beyond these bounds the result is inf or 0 anyway; clamping keeps n in range. Below -104 (a
  // masked score's -inf) the lane computes exp(0) and is zeroed at the end: computing its
  // underflow would cost a microcode assist on Intel cores, ~20x the whole function.
  const M zero = lt(x, -104.0f);
  const auto [t, nf, r] = exp_reduce(select(zero, splat(0.0f), clamp_hi(x, 89.0f)));
  V p = fmadd(exp_series(r), r, splat(1.0f));
  p = fmadd(p, r, splat(1.0f));
  // NaN for NaN: the clamps keep it.
#if defined(__AVX512F__)
  // p 2^n in one instruction, rounded once also where the result is subnormal; 0 where zeroed.
  return reinterpret_cast<V>(_mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero), raw(p), raw(nf)));
#else
  I n = as_int(t) - as_int(splat(kRound));
  I n1 = n >> 1, n2 = n - n1;
  V s1 = as_float((n1 + 127) << 23), s2 = as_float((n2 + 127) << 23);
  return select(zero, splat(0.0f), p * s1 * s2);
#endif
}

inline V log(V x) {
  constexpr float kSqrt2 = 1.41421356237f;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  // Subnormals: scaled into the normal range first.
  M tiny = lt(x, std::numeric_limits<float>::min());
  V xs = select(tiny, x * 8388608.0f, x);  // 2^23
  I u = as_int(xs);
  I e = ((u >> 23) & 0xff) - 127;
  e = selecti(tiny, e - 23, e);
  V m = as_float((u & 0x007fffff) | 0x3f800000);  // [1, 2)
  M big = gt(m, kSqrt2);
  m = select(big, m * 0.5f, m);
  e = selecti(big, e + 1, e);
  V f = m - 1.0f;
  V s = div(f, 2.0f + f);
  V z = s * s;
  V q = splat(1.0f / 11);
  q = fmadd(q, z, splat(1.0f / 9));
  q = fmadd(q, z, splat(1.0f / 7));
  q = fmadd(q, z, splat(1.0f / 5));
  q = fmadd(q, z, splat(1.0f / 3));
  V rz = q * z;
  // f - s (f - 2 R) keeps f exact and puts the rounding in a term 5x smaller than f.
  V lg = f - s * fmadd(splat(-2.0f), rz, f);
  V ef = __builtin_convertvector(e, V);
  V y = fmadd(ef, splat(kLn2Hi), fmadd(ef, splat(kLn2Lo), lg));
  y = select(lt(x, 0.0f), splat(std::numeric_limits<float>::quiet_NaN()), y);
  y = select(eq(x, 0.0f), splat(-kInf), y);
  y = select(eq(x, kInf), splat(kInf), y);
  return select(isnan(x), x, y);
}

// e^u - 1 for u in [-18.2, 0]: the reduction of exp, e^r - 1 = r + r^2 Q(r) by the same Taylor
// series (so that small results keep their precision), and e^u - 1 = 2^n (e^r - 1) + (2^n - 1)
// with one rounding (2^n - 1 is exact for n >= -24).
inline V expm1_neg(V u) {
  const auto [t, nf, r] = exp_reduce(u);
  V q = fmadd(r * r, exp_series(r), r);
#if defined(__AVX512F__)
  V s = reinterpret_cast<V>(_mm512_maskz_scalef_ps(0xffff, _mm512_set1_ps(1.0f), raw(nf)));
#else
  V s = as_float((as_int(t) - as_int(splat(kRound)) + 127) << 23);
#endif
  return fmadd(s, q, s - 1.0f);
}

// tanh |x| = -m / (2 + m) with m = e^{-2|x|} - 1 in (-1, 0]: no cancellation near 0, one division;
// 1 from |x| = 9.1 on (clamped there).
inline V tanh(V x) {
  V ac = clamp_hi(vabs(x), 9.1f);
  V m = expm1_neg(-2.0f * ac);
  // The denominator as d + e = 2 + m exactly (d rounded, e its error): rounding 2 + m alone would
  // cost an ulp of the result where it is in [0.5, 1).
  V d = 2.0f + m;
  V e = (2.0f - d) + m;
  return copysign(div2(-m, d, e), x);
}

// 1 / (1 + e) for x >= 0 and e / (1 + e) below, with e = e^{-|x|} <= 1: no overflow, so tiny
// results keep their precision, and one rounded division.
inline V sigmoid(V x) {
  V e = exp(-vabs(x));
  return div(select(ge(x, 0.0f), splat(1.0f), e), 1.0f + e);
}

namespace detail {
constexpr float kErfSplit = 0.921875f;

// erf(x) for |x| < kErfSplit: x + x R(x^2).
inline V erf_small(V x) {
  V z = x * x;
  V r = splat(-0.0006024473113939166f);
  r = fmadd(r, z, splat(0.005000863689929247f));
  r = fmadd(r, z, splat(-0.02677292935550213f));
  r = fmadd(r, z, splat(0.11282037943601608f));
  r = fmadd(r, z, splat(-0.3761252462863922f));
  r = fmadd(r, z, splat(0.12837916612625122f));
  return fmadd(x, r, x);
}

// erfc(a) e^{a^2} for a >= kErfSplit, as P(1 / (1 + a / 2)).
// (Beyond a = 20 erfc is 0 anyway: a is clamped there, so the denominator stays finite.)
inline V erfc_scaled(V a) {
  V ac = clamp_hi(a, 20.0f);
  V t = div(splat(1.0f), fmadd(ac, 0.5f, 1.0f));
  V p = splat(0.07976900041103363f);
  p = fmadd(p, t, splat(-0.18220804631710052f));
  p = fmadd(p, t, splat(0.02222982607781887f));
  p = fmadd(p, t, splat(0.1067168191075325f));
  p = fmadd(p, t, splat(0.1577533334493637f));
  p = fmadd(p, t, splat(0.25295597314834595f));
  p = fmadd(p, t, splat(0.28100788593292236f));
  p = fmadd(p, t, splat(0.28219643235206604f));
  p = fmadd(p, t, splat(-3.934675987693481e-06f));
  return p;
}

// e^{-(h + l)} where h + l is a square split exactly (l tiny against h). Callers take 0 where
// h > 104 (e^{-h} is 0 there, and l may be inf or NaN).
inline V exp_neg_split(V h, V l) {
  V e = exp(-h);
  return fmadd(-l, e, e);
}
}  // namespace detail

// The rounding error of h = a a, exactly: an FMA, else Dekker's product of Veltkamp halves.
inline V square_error(V a, V h) {
#if defined(__FMA__) || defined(__AVX512F__)
  return fmadd(a, a, -h);
#else
  V c = a * 4097.0f;
  V hi = c - (c - a), lo = a - hi;
  return ((hi * hi - h) + 2.0f * hi * lo) + lo * lo;
#endif
}

// erfc(a) for a >= 0 (NaN for NaN).
inline V erfc_pos(V a) {
  V h = a * a, l = square_error(a, h);
  V tail = select(gt(h, 104.0f), splat(0.0f), detail::exp_neg_split(h, l) * detail::erfc_scaled(a));
  return select(lt(a, detail::kErfSplit), 1.0f - detail::erf_small(a), tail);
}

inline V erf(V x) {
  V ax = vabs(x);
  V y = select(lt(ax, detail::kErfSplit), detail::erf_small(ax), 1.0f - erfc_pos(ax));
  return select(isnan(x), x, copysign(y, x));
}

inline V erfc(V x) {
  V c = erfc_pos(vabs(x));
  return select(lt(x, 0.0f), 2.0f - c, c);
}

// The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, accurate in both tails: the tail's
// e^{-x^2 / 2} comes from x^2 split exactly, so the rounding of x / sqrt 2 only reaches P(t).
inline V phi(V x) {
  constexpr float kInvSqrt2 = 0.7071067811865476f;
  V a = vabs(x) * kInvSqrt2;
  V h = x * x, l = square_error(x, h);
  V tail = select(gt(h, 208.0f), splat(0.0f), detail::exp_neg_split(h * 0.5f, l * 0.5f) * detail::erfc_scaled(a));
  V c = select(lt(a, detail::kErfSplit), 1.0f - detail::erf_small(a), tail);  // erfc(|x| / sqrt 2)
  V half = 0.5f * c;
  V y = select(lt(x, 0.0f), half, 1.0f - half);
  return select(isnan(x), x, y);
}

// ---- row helpers of the row kernels (softmax, cross entropy, the norms, attention) ----

inline float hsum(V v) {
  float s = 0;
  for (int l = 0; l < kLanes; ++l) s += v[l];
  return s;
}

inline float row_sum(const float* x, int64_t n) {
  V acc = splat(0.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc += load(x + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += x[i];
  return s;
}

// The largest element; NaNs are passed over (they reach the caller's sum instead).
inline float row_max(const float* x, int64_t n) {
  V acc = splat(-INFINITY);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V v = load(x + i);
    acc = select(gt(v, acc), v, acc);
  }
  float m = -INFINITY;
  for (int l = 0; l < kLanes; ++l) m = acc[l] > m ? acc[l] : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

// sum(exp(x - m)), storing the exponentials into y when y is not null (y may be x).
inline float exp_shift_sum(const float* x, float m, float* y, int64_t n) {
  V acc = splat(0.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const V e = exp(load(x + i) - m);
    if (y) store(y + i, e);
    acc += e;
  }
  float s = hsum(acc);
  if (i < n) {
    float buf[kLanes];
    for (int k = 0; k < kLanes; ++k) buf[k] = i + k < n ? x[i + k] - m : -INFINITY;
    const V e = exp(load(buf));
    for (int64_t k = 0; i + k < n; ++k) {
      if (y) y[i + k] = e[k];
      s += e[k];
    }
  }
  return s;
}

// y[i] = f(x[i]) over n elements, kLanes at a time; the tail goes through a padded vector.
template <class F>
inline void map(const float* x, float* y, int64_t n, F f) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) store(y + i, f(load(x + i)));
  if (i < n) {
    float buf[kLanes] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * sizeof(float));
    V r = f(load(buf));
    std::memcpy(y + i, &r, static_cast<size_t>(n - i) * sizeof(float));
  }
}

// f on one float: the same bits as the float's lane of a vector call.
template <class F>
inline float scalar(F f, float x) {
  return f(splat(x))[0];
}

}  // namespace px::cpu::vecmath

#pragma GCC diagnostic pop
