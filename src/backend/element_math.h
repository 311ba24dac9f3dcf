// The scalar element math of the elementwise primitives, compiled for the host and for NVIDIA
// devices from this one text: the CUDA backend's generated kernels embed it (NVRTC), and
// tests/backend/test_element_math.cc checks every function here against the `ref` backend's
// kernels on the CPU. Values of every float dtype are computed in f32 (bf16 and f16 are widened
// on load and rounded to nearest even on store), i32 and bool exactly, as the primitives define
// them (src/ops/, docs/ir.md).
//
// Same bits on both sides. The functions use only IEEE-rounded operations (+ - * /, sqrtf, fmaf)
// and integer bit manipulation, with every multiply-add that should be fused written as fmaf: a
// host build compiled with -ffp-contract=off and a device build compiled with --fmad=false (as
// the CUDA backend compiles it) therefore compute the same bits, so the CPU test speaks for the
// device. The transcendentals are the formulas of the CPU backend's vector math
// (src/backend/cpu/vmath.h, which documents their accuracy) written for one float, with IEEE
// division where vmath's AVX-512 path refines a reciprocal: their results agree with the CPU's
// within those bounds, not always bitwise (the CPU build may also fuse multiply-adds that are
// written apart here). Not shared: pow and random_normal's ln, cos and sin call the platform's
// functions (glibc's on the host, libdevice's on a device, each within a few ulp).
//
// Nothing here includes a standard header when NVRTC compiles it (it has none): the fixed-width
// types are spelled out, infinities and NaNs come from their bits.
#pragma once

#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define PX_HD __host__ __device__
#else
#define PX_HD
#endif

#if !defined(__CUDACC_RTC__)
#include <math.h>
#endif

namespace px::em {

using u8 = unsigned char;
using u16 = unsigned short;
using u32 = unsigned int;
using u64 = unsigned long long;
using i32 = int;
using i64 = long long;

// ---- bits ------------------------------------------------------------------------------------

PX_HD inline u32 bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(u32, f);
#endif
}
PX_HD inline float from_bits(u32 u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}
PX_HD inline bool is_nan(float x) { return (bits(x) & 0x7fffffffu) > 0x7f800000u; }
PX_HD inline float inf() { return from_bits(0x7f800000u); }
PX_HD inline float nan() { return from_bits(0x7fc00000u); }
PX_HD inline float fabs_(float x) { return from_bits(bits(x) & 0x7fffffffu); }
PX_HD inline float copysign_(float mag, float sign) {
  return from_bits((bits(mag) & 0x7fffffffu) | (bits(sign) & 0x80000000u));
}
PX_HD inline float fma_(float a, float b, float c) { return fmaf(a, b, c); }

// ---- 16-bit floats ---------------------------------------------------------------------------

PX_HD inline float bf16_to_f32(u16 h) { return from_bits(static_cast<u32>(h) << 16); }

// Round to nearest even in the top 16 bits; a NaN stays a quiet NaN.
PX_HD inline u16 f32_to_bf16(float f) {
  const u32 u = bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<u16>((u >> 16) | 0x40u);
  return static_cast<u16>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

PX_HD inline float f16_to_f32(u16 h) {
  const u32 sign = static_cast<u32>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  if (exp == 0) return from_bits(bits(static_cast<float>(mant) * (1.0f / 16777216.0f)) | sign);  // 0, subnormals
  if (exp == 31) return from_bits(sign | 0x7f800000u | (mant << 13));
  return from_bits(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even; beyond the largest f16 (65504, and what rounds past it) infinity;
// results below 2^-14 are subnormal multiples of 2^-24; NaN gives the quiet NaN 0x7e00 (signed).
PX_HD inline u16 f32_to_f16(float f) {
  const u32 x = bits(f), sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return static_cast<u16>(sign | 0x7e00u);
  if (ax >= 0x477ff000u) return static_cast<u16>(sign | 0x7c00u);
  if (ax < 0x38800000u) {
    // In units of 2^-24 (exact: a power-of-two scale of a value below 2^-14), rounded to nearest even.
    const float scaled = from_bits(ax) * 16777216.0f;
    u32 r = static_cast<u32>(scaled);
    const float frac = scaled - static_cast<float>(r);
    if (frac > 0.5f || (frac == 0.5f && (r & 1u))) ++r;
    return static_cast<u16>(sign | r);
  }
  u32 h = (((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu);
  const u32 rest = ax & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<u16>(sign | h);
}

// The value a store to the dtype and a load back give (what a 16-bit result holds in f32).
PX_HD inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
PX_HD inline float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

// ---- casts -----------------------------------------------------------------------------------

// To i32: truncation toward zero, saturating at the i32 range; NaN gives 0.
PX_HD inline i32 f32_to_i32(float x) {
  if (is_nan(x)) return 0;
  if (x <= -2147483648.0f) return static_cast<i32>(0x80000000u);
  if (x >= 2147483648.0f) return 0x7fffffff;
  return static_cast<i32>(x);  // truncates
}
// To bool: != 0 (NaN is true, -0 false).
PX_HD inline bool f32_to_bool(float x) { return x != 0.0f; }

// ---- float arithmetic ------------------------------------------------------------------------

PX_HD inline float add(float a, float b) { return a + b; }
PX_HD inline float sub(float a, float b) { return a - b; }
PX_HD inline float mul(float a, float b) { return a * b; }
PX_HD inline float div(float a, float b) { return a / b; }
PX_HD inline float pow(float a, float b) { return powf(a, b); }
// NaN in either operand propagates; on ties the second operand is returned (maximum(0, -0) = -0).
PX_HD inline float maximum(float a, float b) { return (a > b || is_nan(a)) ? a : b; }
PX_HD inline float minimum(float a, float b) { return (a < b || is_nan(a)) ? a : b; }
PX_HD inline float neg(float a) { return -a; }
PX_HD inline float abs(float a) { return fabs_(a); }
PX_HD inline float sqrt(float a) { return sqrtf(a); }
PX_HD inline float rsqrt(float a) { return 1.0f / sqrtf(a); }

// ---- integer arithmetic (i32, wrapping as two's complement) ----------------------------------

PX_HD inline i32 wrap(u32 v) { return static_cast<i32>(v); }
PX_HD inline i32 iadd(i32 a, i32 b) { return wrap(static_cast<u32>(a) + static_cast<u32>(b)); }
PX_HD inline i32 isub(i32 a, i32 b) { return wrap(static_cast<u32>(a) - static_cast<u32>(b)); }
PX_HD inline i32 imul(i32 a, i32 b) { return wrap(static_cast<u32>(a) * static_cast<u32>(b)); }
// Truncating; x / 0 gives 0 and INT_MIN / -1 gives INT_MIN (a kernel must not trap).
PX_HD inline i32 idiv(i32 a, i32 b) {
  if (b == 0) return 0;
  if (b == -1) return wrap(0u - static_cast<u32>(a));
  return a / b;
}
PX_HD inline i32 ineg(i32 a) { return wrap(0u - static_cast<u32>(a)); }
PX_HD inline i32 iabs(i32 a) { return a < 0 ? ineg(a) : a; }
PX_HD inline i32 imaximum(i32 a, i32 b) { return a > b ? a : b; }
PX_HD inline i32 iminimum(i32 a, i32 b) { return a < b ? a : b; }

// ---- exp and log -----------------------------------------------------------------------------

namespace detail {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693115234375f;  // 12 significant bits: n * kLn2Hi is exact
constexpr float kLn2Lo = 3.194618494528623e-05f;
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer

// x = n ln2 + r with |r| <= ln2 / 2; t holds n in its low bits (t = n + kRound).
struct ExpReduced {
  float t, nf, r;
};
PX_HD inline ExpReduced exp_reduce(float x) {
  const float t = fma_(x, kLog2e, kRound);
  const float nf = t - kRound;
  const float r = fma_(nf, -kLn2Hi, x);
  return {t, nf, fma_(nf, -kLn2Lo, r)};
}

// (e^r - 1 - r) / r^2 by its Taylor series to the r^5 / 7! term.
PX_HD inline float exp_series(float r) {
  float p = 1.0f / 5040;
  p = fma_(p, r, 1.0f / 720);
  p = fma_(p, r, 1.0f / 120);
  p = fma_(p, r, 1.0f / 24);
  p = fma_(p, r, 1.0f / 6);
  return fma_(p, r, 0.5f);
}

PX_HD inline i32 exp_n(float t) { return static_cast<i32>(bits(t) - bits(kRound)); }
PX_HD inline float pow2(i32 n) { return from_bits(static_cast<u32>(n + 127) << 23); }  // n in [-126, 127]
}  // namespace detail

// e^x within 1 ulp: 0 below -104, inf from 89 on, NaN for NaN. 2^n is applied as two factors, so
// that no scale is subnormal or infinite for n in [-150, 128].
PX_HD inline float exp(float x) {
  if (is_nan(x)) return x;
  if (x < -104.0f) return 0.0f;
  const detail::ExpReduced e = detail::exp_reduce(x > 89.0f ? 89.0f : x);
  float p = fma_(detail::exp_series(e.r), e.r, 1.0f);
  p = fma_(p, e.r, 1.0f);
  const i32 n = detail::exp_n(e.t), n1 = n >> 1, n2 = n - n1;
  return p * detail::pow2(n1) * detail::pow2(n2);
}

// log x within 1 ulp for x > 0 (subnormals included); -inf at +-0, NaN below 0, inf at inf.
PX_HD inline float log(float x) {
  if (is_nan(x)) return x;
  if (x < 0.0f) return nan();
  if (x == 0.0f) return -inf();
  if (x == inf()) return x;
  const bool tiny = x < 1.17549435e-38f;  // subnormal: scaled into the normal range first
  const u32 u = bits(tiny ? x * 8388608.0f : x);
  i32 e = static_cast<i32>((u >> 23) & 0xffu) - 127 - (tiny ? 23 : 0);
  float m = from_bits((u & 0x007fffffu) | 0x3f800000u);  // [1, 2)
  if (m > 1.41421356237f) {
    m = m * 0.5f;
    e = e + 1;
  }
  // log m = 2 atanh(s), s = (m - 1) / (m + 1), by its odd series to s^11.
  const float f = m - 1.0f;
  const float s = f / (2.0f + f);
  const float z = s * s;
  float q = 1.0f / 11;
  q = fma_(q, z, 1.0f / 9);
  q = fma_(q, z, 1.0f / 7);
  q = fma_(q, z, 1.0f / 5);
  q = fma_(q, z, 1.0f / 3);
  const float rz = q * z;
  // f - s (f - 2 R) keeps f exact and puts the rounding in a term 5x smaller than f.
  const float lg = f - s * fma_(-2.0f, rz, f);
  const float ef = static_cast<float>(e);
  return fma_(ef, detail::kLn2Hi, fma_(ef, detail::kLn2Lo, lg));
}

// e^u - 1 for u in [-18.2, 0], keeping the precision of small results: 2^n (e^r - 1) + (2^n - 1)
// with one rounding.
PX_HD inline float expm1_neg(float u) {
  const detail::ExpReduced e = detail::exp_reduce(u);
  const float q = fma_(e.r * e.r, detail::exp_series(e.r), e.r);
  const float s = detail::pow2(detail::exp_n(e.t));
  return fma_(s, q, s - 1.0f);
}

// tanh |x| = -m / (2 + m), m = e^{-2|x|} - 1: no cancellation near 0; +-1 from |x| = 9.1 on. The
// denominator is kept as d + err = 2 + m exactly, so that its rounding does not reach the result.
PX_HD inline float tanh(float x) {
  if (is_nan(x)) return x;
  float ac = fabs_(x);
  if (ac > 9.1f) ac = 9.1f;
  const float m = expm1_neg(-2.0f * ac);
  const float d = 2.0f + m;
  const float err = (2.0f - d) + m;
  const float q = -m / d;
  const float r = fma_(-q, err, fma_(-q, d, -m));
  return copysign_(q + r / d, x);
}

// 1 / (1 + e) for x >= 0 and e / (1 + e) below, e = e^{-|x|}: no overflow in either tail.
PX_HD inline float sigmoid(float x) {
  const float e = exp(-fabs_(x));
  return (x >= 0.0f ? 1.0f : e) / (1.0f + e);
}

// ---- erf, erfc and the normal CDF ------------------------------------------------------------

namespace detail {
constexpr float kErfSplit = 0.921875f;

// erf(x) for |x| < kErfSplit: x + x R(x^2).
PX_HD inline float erf_small(float x) {
  const float z = x * x;
  float r = -0.0006024473113939166f;
  r = fma_(r, z, 0.005000863689929247f);
  r = fma_(r, z, -0.02677292935550213f);
  r = fma_(r, z, 0.11282037943601608f);
  r = fma_(r, z, -0.3761252462863922f);
  r = fma_(r, z, 0.12837916612625122f);
  return fma_(x, r, x);
}

// erfc(a) e^{a^2} for a >= kErfSplit, as P(1 / (1 + a / 2)) (a clamped at 20, where erfc is 0).
PX_HD inline float erfc_scaled(float a) {
  const float ac = a > 20.0f ? 20.0f : a;
  const float t = 1.0f / fma_(ac, 0.5f, 1.0f);
  float p = 0.07976900041103363f;
  p = fma_(p, t, -0.18220804631710052f);
  p = fma_(p, t, 0.02222982607781887f);
  p = fma_(p, t, 0.1067168191075325f);
  p = fma_(p, t, 0.1577533334493637f);
  p = fma_(p, t, 0.25295597314834595f);
  p = fma_(p, t, 0.28100788593292236f);
  p = fma_(p, t, 0.28219643235206604f);
  p = fma_(p, t, -3.934675987693481e-06f);
  return p;
}

// e^{-(h + l)} for a square split exactly as h + l (l tiny against h); 0 from h = 104 on.
PX_HD inline float exp_neg_split(float h, float l) {
  if (h > 104.0f) return 0.0f;
  const float e = exp(-h);
  return fma_(-l, e, e);
}

// erfc(a) for a >= 0.
PX_HD inline float erfc_pos(float a) {
  if (a < kErfSplit) return 1.0f - erf_small(a);
  const float h = a * a, l = fma_(a, a, -h);
  return exp_neg_split(h, l) * erfc_scaled(a);
}
}  // namespace detail

PX_HD inline float erf(float x) {
  if (is_nan(x)) return x;
  const float ax = fabs_(x);
  const float y = ax < detail::kErfSplit ? detail::erf_small(ax) : 1.0f - detail::erfc_pos(ax);
  return copysign_(y, x);
}

PX_HD inline float erfc(float x) {
  if (is_nan(x)) return x;
  const float c = detail::erfc_pos(fabs_(x));
  return x < 0.0f ? 2.0f - c : c;
}

// Phi(x) = erfc(-x / sqrt 2) / 2, accurate in both tails: e^{-x^2 / 2} comes from x^2 split exactly.
PX_HD inline float phi(float x) {
  if (is_nan(x)) return x;
  const float a = fabs_(x) * 0.7071067811865476f;
  float c;
  if (a < detail::kErfSplit) {
    c = 1.0f - detail::erf_small(a);
  } else {
    const float h = x * x, l = fma_(x, x, -h);
    c = h > 208.0f ? 0.0f : detail::exp_neg_split(h * 0.5f, l * 0.5f) * detail::erfc_scaled(a);
  }
  const float half = 0.5f * c;
  return x < 0.0f ? half : 1.0f - half;
}

// ---- the nn elementwise primitives -----------------------------------------------------------

namespace detail {
constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
}  // namespace detail

// gelu: the erf form x Phi(x), or the tanh form 0.5 x (1 + tanh(u)) = x sigmoid(2u) with
// u = sqrt(2/pi) (x + 0.044715 x^3), which does not cancel for negative x.
PX_HD inline float gelu(float x, bool tanh_form) {
  using namespace detail;
  if (tanh_form) return x * sigmoid(2.0f * kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return x * phi(x);
}

// d/dx gelu. tanh form: s + x s (1 - s) z' with z = 2u, e = e^{-|z|}, r = 1 / (1 + e): s and 1 - s
// are r and e r (by the sign of z), so s (1 - s) = e r^2. erf form: Phi(x) + x phi'(x).
PX_HD inline float gelu_grad(float x, bool tanh_form) {
  using namespace detail;
  if (tanh_form) {
    const float z = 2.0f * kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float e = exp(-fabs_(z));
    const float r = 1.0f / (1.0f + e);
    const float er = e * r;
    const float s = z >= 0.0f ? r : er;
    // Where e is 0 (|z| > 104) the second term is 0, also where x^2 overflows (0 inf would be NaN).
    if (er == 0.0f) return s + 0.0f * x;
    return s + x * (er * r) * (2.0f * kSqrt2OverPi) * (1.0f + 3.0f * kGeluCubic * x * x);
  }
  return phi(x) + x * kInvSqrt2Pi * exp(-0.5f * x * x);
}

PX_HD inline float silu(float x) { return x * sigmoid(x); }

// ---- the optimizer update --------------------------------------------------------------------

// One element of adamw_update in f32, rounded as the CPU backend's loop (src/backend/cpu/optim.cc,
// compiled without fused multiply-adds): m' = m b1 + g c1, v' = v b2 + g^2 c2,
// p' = p - m' step / (sqrt(v') inv_sqrt_bc2 + eps) [- p wd]. b1, c1 = 1 - beta1, b2, c2 = 1 - beta2
// and eps are the attributes as f32; step, inv_sqrt_bc2 and wd are the update's operands.
struct AdamW {
  float p, m, v;
};
PX_HD inline AdamW adamw(float p, float g, float m, float v, float b1, float c1, float b2, float c2, float eps,
                         float step, float inv_sqrt_bc2, bool decay, float wd) {
  const float mi = m * b1 + g * c1;
  const float vi = v * b2 + (g * g) * c2;
  float np = p - (mi * step) / (sqrtf(vi) * inv_sqrt_bc2 + eps);
  if (decay) np = np - p * wd;
  return {np, mi, vi};
}

// ---- counter-based random numbers (src/ops/rng.cc) -------------------------------------------

// Philox-4x32-10 (Salmon et al., SC'11) on counter (c0, c1, c2, c3) under key (k0, k1).
struct Philox {
  u32 w[4];
};
PX_HD inline Philox philox4x32_10(u32 c0, u32 c1, u32 c2, u32 c3, u32 k0, u32 k1) {
  for (int round = 0; round < 10; ++round) {
    const u64 p0 = static_cast<u64>(0xD2511F53u) * c0, p1 = static_cast<u64>(0xCD9E8D57u) * c2;
    const u32 n0 = static_cast<u32>(p1 >> 32) ^ c1 ^ k0, n2 = static_cast<u32>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<u32>(p1);
    c3 = static_cast<u32>(p0);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return {{c0, c1, c2, c3}};
}

// The Philox block of element `index` of a draw (row-major in the draw's global shape): element i
// takes lane i % 4 of the block for counter i / 4.
PX_HD inline Philox draw_block(u64 index, u32 k0, u32 k1) {
  const u64 block = index >> 2;
  return philox4x32_10(static_cast<u32>(block), static_cast<u32>(block >> 32), 0, 0, k0, k1);
}

// random_uniform's element in f32: lo + (hi - lo) u, u = (bits >> 8) 2^-24 in [0, 1), the
// multiply-add rounded once. The caller rounds it to the result dtype and moves a value that
// lands on hi or below lo inside (uniform_in_range, below).
PX_HD inline float uniform(u64 index, u32 k0, u32 k1, float lo, float hi) {
  const Philox b = draw_block(index, k0, k1);
  const float u = static_cast<float>(b.w[index & 3] >> 8) * (1.0f / 16777216.0f);
  return fma_(hi - lo, u, lo);
}
// The float dtypes of a draw's result, as the generated kernels name them.
enum Float : int { kF32 = 0, kBF16 = 1, kF16 = 2 };
PX_HD inline float round_to(int dtype, float v) {
  return dtype == kBF16 ? round_bf16(v) : dtype == kF16 ? round_f16(v) : v;
}

// The 16-bit value next to r (a value of that dtype), one step up or down (sign-magnitude bits).
PX_HD inline float step16(int dtype, float r, bool up) {
  u16 b = dtype == kBF16 ? f32_to_bf16(r) : f32_to_f16(r);
  if (r == 0.0f)
    b = up ? 0x0001 : 0x8001;  // the smallest subnormals
  else
    b = static_cast<u16>((r > 0) == up ? b + 1 : b - 1);
  return dtype == kBF16 ? bf16_to_f32(b) : f16_to_f32(b);
}

// Where a uniform draw that rounds onto hi or below lo in the result dtype goes: the largest value
// of the dtype below hi and the smallest at or above lo (computed once per kernel, lo < hi finite).
struct UniformBounds {
  float top, bottom;
};
PX_HD inline UniformBounds uniform_bounds(int dtype, float lo, float hi) {
  float top = round_to(dtype, hi), bottom = round_to(dtype, lo);
  if (top >= hi) {
    if (dtype != kF32)
      top = step16(dtype, top, false);
    else  // the float below hi
      top = hi > 0.0f ? from_bits(bits(hi) - 1) : hi == 0.0f ? from_bits(0x80000001u) : from_bits(bits(hi) + 1);
  }
  if (bottom < lo) bottom = step16(dtype, bottom, true);
  return {top, bottom};
}

// The draw rounded to the result dtype and kept in [lo, hi).
PX_HD inline float uniform_in_range(float v, int dtype, float lo, float hi, UniformBounds b) {
  v = round_to(dtype, v);
  return v >= hi ? b.top : v < lo ? b.bottom : v;
}

// random_normal's element: Box-Muller on lanes (0, 1) and (2, 3) of the block, u1 in (0, 1],
// r = sqrt(-2 ln u1), (r cos 2 pi u2, r sin 2 pi u2). ln, cos and sin are the platform's (glibc's
// f32 functions on the host, libdevice's on a device), so normals agree closely, not bitwise.
PX_HD inline float normal(u64 index, u32 k0, u32 k1) {
  const Philox b = draw_block(index, k0, k1);
  const int lane = static_cast<int>(index & 3), pair = lane / 2;
  const float u1 = (static_cast<float>(b.w[2 * pair] >> 8) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>(b.w[2 * pair + 1] >> 8) * (1.0f / 16777216.0f);
  const float r = sqrtf(-2.0f * logf(u1));
  const float angle = 6.28318530717958647692f * u2;
  return lane % 2 == 0 ? r * cosf(angle) : r * sinf(angle);
}

// fold_in(key, data): the first two words of the block for counter (data, 0, 0xF01D1), which no
// draw uses.
PX_HD inline Philox fold_in(u32 k0, u32 k1, u64 data) {
  return philox4x32_10(static_cast<u32>(data), static_cast<u32>(data >> 32), 0, 0xF01D1u, k0, k1);
}

}  // namespace px::em
