// CPU kernels of the elementwise family: f32 block functions (chained by the fused-loop engine),
// exact i32 block functions, and the single-node kernel used when a node runs unfused.
#include <omp.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <memory>

#ifdef __AVX__
#include <immintrin.h>
#endif

#include "backend/cpu/kernel.h"
#include "backend/cpu/vmath.h"
#include "ops/prims.h"

namespace px::cpu {

void register_constant_kernels();  // elementwise_const.cc

namespace {

// c ? a : b as bit masks. Both operands are computed anyway; a plain ?: lets GCC sink a
// trapping float operation into a branch, which (under -ftrapping-math) blocks vectorization.
inline float select(bool c, float a, float b) {
  int32_t m = -static_cast<int32_t>(c);
  return std::bit_cast<float>((std::bit_cast<int32_t>(a) & m) | (std::bit_cast<int32_t>(b) & ~m));
}

// ---- f32 block functions ---------------------------------------------------------------------
// Operands never alias the result (the engines give every step its own scratch), hence restrict.

template <class Op>
void unary_f32(const float* const* in, float* out, int64_t n, const float*) {
  const float* __restrict a = in[0];
  float* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = Op::f(a[i]);
}

// The transcendentals: vmath.h's vector functions, kLanes at a time (the same bits in every lane).
template <class Op>
void vec_unary_f32(const float* const* in, float* out, int64_t n, const float*) {
  vecmath::map(in[0], out, n, [](vecmath::V v) { return Op::v(v); });
}

template <class Op>
void binary_f32(const float* const* in, float* out, int64_t n, const float*) {
  const float* __restrict a = in[0];
  const float* __restrict b = in[1];
  float* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = Op::f(a[i], b[i]);
}

template <class Op>
void unary_i32(const int32_t* const* in, int32_t* out, int64_t n, const float*) {
  const int32_t* __restrict a = in[0];
  int32_t* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = Op::i(a[i]);
}

template <class Op>
void binary_i32(const int32_t* const* in, int32_t* out, int64_t n, const float*) {
  const int32_t* __restrict a = in[0];
  const int32_t* __restrict b = in[1];
  int32_t* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = Op::i(a[i], b[i]);
}

// Integer arithmetic wraps around (two's complement) instead of being undefined on overflow.
inline int32_t wrap(uint32_t v) { return static_cast<int32_t>(v); }
inline uint32_t u(int32_t v) { return static_cast<uint32_t>(v); }
inline float b2f(bool c) { return select(c, 1.0f, 0.0f); }

struct Add {
  static float f(float a, float b) { return a + b; }
  static int32_t i(int32_t a, int32_t b) { return wrap(u(a) + u(b)); }
};
struct Sub {
  static float f(float a, float b) { return a - b; }
  static int32_t i(int32_t a, int32_t b) { return wrap(u(a) - u(b)); }
};
struct Mul {
  static float f(float a, float b) { return a * b; }
  static int32_t i(int32_t a, int32_t b) { return wrap(u(a) * u(b)); }
};
struct Div {
  static float f(float a, float b) { return a / b; }
  // Truncating; x / 0 gives 0 and INT_MIN / -1 wraps, since kernels must not trap.
  static int32_t i(int32_t a, int32_t b) {
    if (b == 0) return 0;
    if (b == -1) return wrap(0u - u(a));
    return a / b;
  }
};
struct Pow {
  static float f(float a, float b) { return std::pow(a, b); }
};
// NaN in either operand propagates, as in numpy.
struct Max {
  static float f(float a, float b) { return select(a > b || a != a, a, b); }
  static int32_t i(int32_t a, int32_t b) { return a > b ? a : b; }
};
struct Min {
  static float f(float a, float b) { return select(a < b || a != a, a, b); }
  static int32_t i(int32_t a, int32_t b) { return a < b ? a : b; }
};
struct Neg {
  static float f(float a) { return -a; }
  static int32_t i(int32_t a) { return wrap(0u - u(a)); }
};
struct Abs {
  static float f(float a) { return std::fabs(a); }
  static int32_t i(int32_t a) { return a < 0 ? wrap(0u - u(a)) : a; }
};
struct Exp {
  static vecmath::V v(vecmath::V a) { return vecmath::exp(a); }
};
struct Log {
  static vecmath::V v(vecmath::V a) { return vecmath::log(a); }
};
struct Tanh {
  static vecmath::V v(vecmath::V a) { return vecmath::tanh(a); }
};
struct Sigmoid {
  static vecmath::V v(vecmath::V a) { return vecmath::sigmoid(a); }
};
struct Eq {
  static float f(float a, float b) { return b2f(a == b); }
  static int32_t i(int32_t a, int32_t b) { return a == b; }
};
struct Ne {
  static float f(float a, float b) { return b2f(a != b); }
  static int32_t i(int32_t a, int32_t b) { return a != b; }
};
struct Lt {
  static float f(float a, float b) { return b2f(a < b); }
  static int32_t i(int32_t a, int32_t b) { return a < b; }
};
struct Le {
  static float f(float a, float b) { return b2f(a <= b); }
  static int32_t i(int32_t a, int32_t b) { return a <= b; }
};
struct Gt {
  static float f(float a, float b) { return b2f(a > b); }
  static int32_t i(int32_t a, int32_t b) { return a > b; }
};
struct Ge {
  static float f(float a, float b) { return b2f(a >= b); }
  static int32_t i(int32_t a, int32_t b) { return a >= b; }
};
struct And {
  static float f(float a, float b) { return b2f(a != 0.0f && b != 0.0f); }
  static int32_t i(int32_t a, int32_t b) { return a != 0 && b != 0; }
};
struct Or {
  static float f(float a, float b) { return b2f(a != 0.0f || b != 0.0f); }
  static int32_t i(int32_t a, int32_t b) { return a != 0 || b != 0; }
};
struct Not {
  static float f(float a) { return b2f(a == 0.0f); }
  static int32_t i(int32_t a) { return a == 0; }
};
struct Copy {
  static float f(float a) { return a; }
  static int32_t i(int32_t a) { return a; }
};

// sqrt loops do not auto-vectorize under -fmath-errno (a negative operand must set errno), so
// the vector part uses intrinsics; both give the correctly rounded IEEE square root.
template <bool kReciprocal>
void sqrt_f32(const float* const* in, float* out, int64_t n, const float*) {
  const float* __restrict a = in[0];
  float* __restrict o = out;
  int64_t i = 0;
#ifdef __AVX__
  const __m256 one = _mm256_set1_ps(1.0f);
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_sqrt_ps(_mm256_loadu_ps(a + i));
    _mm256_storeu_ps(o + i, kReciprocal ? _mm256_div_ps(one, r) : r);
  }
#endif
  for (; i < n; ++i) o[i] = kReciprocal ? 1.0f / std::sqrt(a[i]) : std::sqrt(a[i]);
}

void select_f32(const float* const* in, float* out, int64_t n, const float*) {
  const float* __restrict c = in[0];
  const float* __restrict a = in[1];
  const float* __restrict b = in[2];
  float* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = select(c[i] != 0.0f, a[i], b[i]);
}

void select_i32(const int32_t* const* in, int32_t* out, int64_t n, const float*) {
  const int32_t* __restrict c = in[0];
  const int32_t* __restrict a = in[1];
  const int32_t* __restrict b = in[2];
  int32_t* __restrict o = out;
  for (int64_t i = 0; i < n; ++i) o[i] = c[i] != 0 ? a[i] : b[i];
}

// `full`: params = {value as float, high and low 16 bits of the value as i32}.
void full_f32(const float* const*, float* out, int64_t n, const float* p) {
  float v = p[0];
  for (int64_t i = 0; i < n; ++i) out[i] = v;
}

void full_i32(const int32_t* const*, int32_t* out, int64_t n, const float* p) {
  int32_t v = wrap((u(static_cast<int32_t>(p[1])) << 16) | u(static_cast<int32_t>(p[2])));
  for (int64_t i = 0; i < n; ++i) out[i] = v;
}

std::vector<float> full_params(const Attrs& a) {
  double v = a.f("value");
  int32_t iv = static_cast<int32_t>(std::clamp(v, static_cast<double>(INT32_MIN), static_cast<double>(INT32_MAX)));
  if (std::isnan(v)) iv = 0;
  return {static_cast<float>(v), static_cast<float>(iv >> 16), static_cast<float>(iv & 0xffff)};
}

// ---- cast: values are rounded to the target's precision, as a store to that dtype would ----

inline float round_bf16(float x) {
  uint32_t b = std::bit_cast<uint32_t>(x);
  uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;  // round to nearest even
  return select(x != x, x, std::bit_cast<float>(r));
}

inline float round_f16(float x) {
  float ax = std::fabs(x);
  // Normal f16 numbers keep 10 mantissa bits; subnormals (< 2^-14) are multiples of 2^-24,
  // which adding and removing 0.5 (whose ulp is 2^-24) rounds to.
  uint32_t b = std::bit_cast<uint32_t>(ax);
  float normal = std::bit_cast<float>((b + 0xfffu + ((b >> 13) & 1u)) & 0xffffe000u);
  float sub = (ax + 0.5f) - 0.5f;
  float r = select(ax < 6.103515625e-05f, sub, normal);
  r = select(r > 65504.0f, std::numeric_limits<float>::infinity(), r);
  return select(x != x, x, std::copysign(r, x));
}

// Truncation toward zero, saturating at the i32 range; NaN becomes 0.
inline float round_i32(float x) {
  float t = std::trunc(x);
  t = select(t < -2147483648.0f, -2147483648.0f, t);
  t = select(t > 2147483520.0f, 2147483520.0f, t);
  return select(x != x, 0.0f, t);
}

void cast_f32(const float* const* in, float* out, int64_t n, const float* p) {
  const float* __restrict a = in[0];
  float* __restrict o = out;
  switch (static_cast<DType>(static_cast<int>(p[0]))) {
    case DType::f32:
      for (int64_t i = 0; i < n; ++i) o[i] = a[i];
      break;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) o[i] = round_bf16(a[i]);
      break;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) o[i] = round_f16(a[i]);
      break;
    case DType::i32:
      for (int64_t i = 0; i < n; ++i) o[i] = round_i32(a[i]);
      break;
    case DType::boolean:
      for (int64_t i = 0; i < n; ++i) o[i] = b2f(a[i] != 0.0f);
      break;
  }
}

void cast_i32(const int32_t* const* in, int32_t* out, int64_t n, const float* p) {
  const int32_t* __restrict a = in[0];
  int32_t* __restrict o = out;
  if (static_cast<DType>(static_cast<int>(p[0])) == DType::boolean) {
    for (int64_t i = 0; i < n; ++i) o[i] = a[i] != 0;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = a[i];
  }
}

std::vector<float> cast_params(const Attrs& a) { return {static_cast<float>(static_cast<int>(a.dtype("dtype")))}; }

// ---- the single-node kernel (unfused runs, and the exact integer path) ----------------------

constexpr int64_t kTile = 1024;
constexpr int kMaxOperands = 8;

bool int_like(DType d) { return d == DType::i32 || d == DType::boolean; }

Kernel make_node_kernel(const EltwiseKernel& ek, const KernelSpec& spec) {
  std::vector<DType> in_t;
  for (const TensorType& t : spec.in) in_t.push_back(t.dtype);
  DType out_t = spec.out.at(0).dtype;
  int64_t count = spec.out.at(0).numel();
  int nin = static_cast<int>(in_t.size());
  std::vector<float> params = ek.params ? ek.params(spec.attrs) : std::vector<float>{};
  if (params.empty()) params.push_back(0.0f);  // a valid pointer for every block function
  int threads = num_threads();
  bool all_int = int_like(out_t);
  for (DType d : in_t) all_int = all_int && int_like(d);

  if (all_int && ek.i32) {
    EltwiseI32 fn = ek.i32;
    // Bool operands and results are widened to i32 per tile in per-thread scratch.
    auto scratch = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(threads) * (nin + 1) * kTile);
    return [=](const void* const* in, void* const* out) {
      int64_t ntiles = (count + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) num_threads(threads) if (ntiles > 8)
      for (int64_t t = 0; t < ntiles; ++t) {
        int32_t* s = scratch->data() + static_cast<size_t>(omp_get_thread_num()) * (nin + 1) * kTile;
        int64_t off = t * kTile, len = std::min(kTile, count - off);
        const int32_t* ptrs[kMaxOperands];
        for (int k = 0; k < nin; ++k) {
          if (in_t[k] == DType::i32) {
            ptrs[k] = static_cast<const int32_t*>(in[k]) + off;
          } else {
            const uint8_t* b = static_cast<const uint8_t*>(in[k]) + off;
            int32_t* d = s + k * kTile;
            for (int64_t i = 0; i < len; ++i) d[i] = b[i];
            ptrs[k] = d;
          }
        }
        if (out_t == DType::i32) {
          fn(ptrs, static_cast<int32_t*>(out[0]) + off, len, params.data());
        } else {
          int32_t* r = s + nin * kTile;
          fn(ptrs, r, len, params.data());
          uint8_t* o = static_cast<uint8_t*>(out[0]) + off;
          for (int64_t i = 0; i < len; ++i) o[i] = r[i] != 0;
        }
      }
    };
  }

  EltwiseF32 fn = ek.f32;
  auto scratch = std::make_shared<std::vector<float>>(static_cast<size_t>(threads) * (nin + 1) * kTile);
  return [=](const void* const* in, void* const* out) {
    int64_t ntiles = (count + kTile - 1) / kTile;
#pragma omp parallel for schedule(static) num_threads(threads) if (ntiles > 8)
    for (int64_t t = 0; t < ntiles; ++t) {
      float* s = scratch->data() + static_cast<size_t>(omp_get_thread_num()) * (nin + 1) * kTile;
      int64_t off = t * kTile, len = std::min(kTile, count - off);
      const float* ptrs[kMaxOperands];
      for (int k = 0; k < nin; ++k) {
        if (in_t[k] == DType::f32) {
          ptrs[k] = static_cast<const float*>(in[k]) + off;
        } else {
          load_f32(in[k], in_t[k], off, s + k * kTile, len);
          ptrs[k] = s + k * kTile;
        }
      }
      if (out_t == DType::f32) {
        fn(ptrs, static_cast<float*>(out[0]) + off, len, params.data());
      } else {
        float* r = s + nin * kTile;
        fn(ptrs, r, len, params.data());
        store_f32(r, out[0], out_t, off, len);
      }
    }
  };
}

void reg(const Primitive* prim, EltwiseKernel k) {
  register_eltwise(prim, k);
  register_kernel(prim, [k](const KernelSpec& spec) { return make_node_kernel(k, spec); });
}

template <class Op>
EltwiseKernel un(bool with_int = true) {
  EltwiseKernel k;
  if constexpr (requires { Op::v(vecmath::V{}); })
    k.f32 = vec_unary_f32<Op>;
  else
    k.f32 = unary_f32<Op>;
  if constexpr (requires { Op::i(0); }) {
    if (with_int) k.i32 = unary_i32<Op>;
  }
  return k;
}

template <class Op>
EltwiseKernel bin() {
  EltwiseKernel k;
  k.f32 = binary_f32<Op>;
  if constexpr (requires { Op::i(0, 0); }) k.i32 = binary_i32<Op>;
  return k;
}

}  // namespace

void register_elementwise_kernels() {
  reg(prims::add(), bin<Add>());
  reg(prims::sub(), bin<Sub>());
  reg(prims::mul(), bin<Mul>());
  reg(prims::div(), bin<Div>());
  reg(prims::pow(), bin<Pow>());
  reg(prims::maximum(), bin<Max>());
  reg(prims::minimum(), bin<Min>());
  reg(prims::neg(), un<Neg>());
  reg(prims::abs(), un<Abs>());
  reg(prims::exp(), un<Exp>());
  reg(prims::log(), un<Log>());
  reg(prims::tanh(), un<Tanh>());
  reg(prims::sigmoid(), un<Sigmoid>());
  reg(prims::sqrt(), EltwiseKernel{sqrt_f32<false>, nullptr, nullptr});
  reg(prims::rsqrt(), EltwiseKernel{sqrt_f32<true>, nullptr, nullptr});
  reg(prims::eq(), bin<Eq>());
  reg(prims::ne(), bin<Ne>());
  reg(prims::lt(), bin<Lt>());
  reg(prims::le(), bin<Le>());
  reg(prims::gt(), bin<Gt>());
  reg(prims::ge(), bin<Ge>());
  reg(prims::logical_and(), bin<And>());
  reg(prims::logical_or(), bin<Or>());
  reg(prims::logical_not(), un<Not>());
  reg(prims::stop_gradient(), un<Copy>());
  reg(prims::tag(), un<Copy>());
  reg(prims::select(), EltwiseKernel{select_f32, select_i32, nullptr});
  reg(prims::cast(), EltwiseKernel{cast_f32, cast_i32, cast_params});
  // `full` fuses as an elementwise op with no operands; its exact kernel is a plain fill.
  register_eltwise(prims::full(), EltwiseKernel{full_f32, full_i32, full_params});
  register_constant_kernels();
}

}  // namespace px::cpu
