// The shared element math (src/backend/element_math.h, what the CUDA backend's generated kernels
// compute) against the `ref` backend's kernels, run on the same inputs: every elementwise
// primitive in f32, bf16 and f16 (and i32 and bool where it takes them), over a stride through
// every float bit pattern of both signs, a dense sweep of [-12, 12] and the special values (+-0,
// +-inf, NaN, subnormals, FLT_MAX, 16-bit rounding ties). Exactly rounded operations (arithmetic,
// sqrt, comparisons, select, casts, integer ops) must give the ref backend's bits; the
// transcendentals must stay within their documented error (src/backend/cpu/vmath.h) of the ref
// backend's correctly rounded result. The random streams must equal the CPU backend's: uniform
// draws (dropout masks) and fold_in bit for bit, normal draws too (the same platform functions).
//
// This file is compiled without contraction of multiply-adds (tests/CMakeLists.txt), as the CUDA
// backend compiles the header for the device (--fmad=false): the bits checked here are the device's.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernel.h"
#include "backend/element_math.h"
#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---- inputs ----------------------------------------------------------------------------------

std::vector<float> special_values() {
  return {0.0f,          -0.0f,         kInf,           -kInf,          std::nanf(""), -std::nanf(""), FLT_MIN,
          -FLT_MIN,      FLT_TRUE_MIN,  -FLT_TRUE_MIN,  FLT_MAX,        -FLT_MAX,      1.0f,           -1.0f,
          0.5f,          2.0f,          3.0f,           -3.0f,          88.72283f,     89.0f,          -104.0f,
          -87.33654f,    9.1f,          -9.1f,          0.921875f,      -0.921875f,    20.0f,          -20.0f,
          65504.0f,      65519.0f,      65520.0f,       -65520.0f,      1e5f,          3e-5f,          1e-7f,
          2.9e-8f,       5.9604645e-8f, 2.9802322e-8f,  1.00390625f,    1.01171875f,   1.0009765625f,  3.4e38f,
          2147483520.0f, 2147483648.0f, -2147483648.0f, -2147483904.0f, 0.49999997f,   -0.49999997f,   1e-40f,
          -1e-40f};
}

// Every 4099th float bit pattern of both signs, a dense sweep of [-12, 12] and the special values.
std::vector<float> float_inputs() {
  std::vector<float> x = special_values();
  for (uint64_t u = 0; u <= 0x7fffffffu; u += 4099) {
    x.push_back(from_bits(static_cast<uint32_t>(u)));
    x.push_back(-from_bits(static_cast<uint32_t>(u)));
  }
  for (int i = -120000; i <= 120000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
  return x;
}

// A second operand for binary ops: the inputs in another order (every pair of special values too).
std::vector<float> shuffled(const std::vector<float>& x) {
  std::vector<float> y = x;
  std::mt19937 rng(7);
  std::shuffle(y.begin(), y.end(), rng);
  const std::vector<float> s = special_values();
  for (size_t i = 0; i < s.size() && i * s.size() < y.size(); ++i)
    for (size_t j = 0; j < s.size(); ++j) y[i * s.size() + j] = s[j];
  return y;
}

// ---- buffers of a dtype ----------------------------------------------------------------------

// Values as stored in dtype t (rounded as the ref backend stores them).
std::vector<std::byte> encode(const std::vector<float>& x, DType t) {
  std::vector<std::byte> b(x.size() * static_cast<size_t>(dtype_size(t)));
  for (size_t i = 0; i < x.size(); ++i) ref::store(b.data(), t, static_cast<int64_t>(i), x[i]);
  return b;
}

// Element i of a dtype-t buffer as the header loads it (f32 for float dtypes).
float em_load(const std::vector<std::byte>& b, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return reinterpret_cast<const float*>(b.data())[i];
    case DType::bf16:
      return em::bf16_to_f32(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::f16:
      return em::f16_to_f32(reinterpret_cast<const uint16_t*>(b.data())[i]);
    case DType::i32:
      return static_cast<float>(reinterpret_cast<const int32_t*>(b.data())[i]);
    case DType::boolean:
      return reinterpret_cast<const uint8_t*>(b.data())[i] ? 1.0f : 0.0f;
  }
  return 0;
}

// An f32 result stored to a float dtype as the header stores it, read back as f32.
float em_store(float v, DType t) {
  if (t == DType::bf16) return em::round_bf16(v);
  if (t == DType::f16) return em::round_f16(v);
  return v;
}

// The ref backend's kernel for `prim` on operands of the given types, results read back as f32.
std::vector<float> run_ref(const Primitive* prim, const std::vector<std::vector<std::byte>>& in,
                           const std::vector<DType>& in_t, DType out_t, int64_t n, const Attrs& attrs = {}) {
  std::vector<TensorType> it, ot{TensorType{out_t, {n}}};
  for (DType d : in_t) it.push_back(TensorType{d, {n}});
  const ref::Factory* f = ref::find_kernel(prim);
  if (!f) throw std::runtime_error("no ref kernel for " + prim->name);
  Kernel k = (*f)(ref::Spec{it, ot, attrs});
  std::vector<std::byte> out(static_cast<size_t>(n * dtype_size(out_t)));
  std::vector<const void*> ip;
  for (const auto& b : in) ip.push_back(b.data());
  void* op[] = {out.data()};
  k(ip.data(), op);
  std::vector<float> r(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) r[i] = static_cast<float>(ref::load(out.data(), out_t, i));
  return r;
}

// The unit in the last place of |r|'s binade in dtype t (its smallest subnormal below the normals).
double ulp_of(double r, DType t) {
  const int mant = t == DType::f32 ? 23 : t == DType::bf16 ? 7 : 10;
  const int min_exp = t == DType::f16 ? -14 : -126;
  const double a = std::fabs(r);
  const int e = a == 0 || std::ilogb(a) < min_exp ? min_exp : std::ilogb(a);
  return std::ldexp(1.0, e - mant);
}

// How far `got` is from the ref backend's `want`, in ulps of `want` in dtype t: 0 when both are
// the same NaN-ness and value (or equal infinities), 1e9 on a mismatch of NaN, infinity or sign.
double distance(float got, float want, DType t) {
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got) ? 0 : 1e9;
  if (got == want) return 0;
  if (std::isinf(want) || std::isinf(got)) {
    // One step past the largest finite value is the next binade's ulp.
    const double maxv = t == DType::f32 ? FLT_MAX : t == DType::bf16 ? 3.3895313892515355e38 : 65504.0;
    const double g = std::isinf(got) ? std::copysign(maxv + ulp_of(maxv, t), got) : got;
    const double w = std::isinf(want) ? std::copysign(maxv + ulp_of(maxv, t), want) : want;
    return std::fabs(g - w) / ulp_of(maxv, t);
  }
  return std::fabs(static_cast<double>(got) - want) / ulp_of(want, t);
}

struct Check {
  double worst = 0;
  size_t at = 0;
};

// Runs the unary or binary float primitive through the ref backend and the header function in each
// float dtype; `ulps` is the bound (0: the same bits; -0 and +0 count as different).
// `skip` leaves out inputs outside a function's documented range; `scale`, where given, measures
// the error in ulps of max(|result|, scale(x)) instead (a result that is a difference of terms of
// that size, near its zeros).
void check_float_op(const Primitive* prim, int arity, const std::function<float(float, float)>& f, double ulps,
                    const Attrs& attrs = {}, const std::function<bool(float)>& skip = nullptr,
                    const std::function<double(float)>& scale = nullptr) {
  const std::vector<float> x = float_inputs(), y = shuffled(x);
  const int64_t n = static_cast<int64_t>(x.size());
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::vector<std::byte>> in{encode(x, t)};
    if (arity == 2) in.push_back(encode(y, t));
    const std::vector<float> want = run_ref(prim, in, std::vector<DType>(arity, t), t, n, attrs);
    Check c;
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = em_load(in[0], t, i), b = arity == 2 ? em_load(in[1], t, i) : 0.0f;
      if (skip && skip(a)) continue;
      const float got = em_store(f(a, b), t);
      double d = distance(got, want[i], t);
      if (scale && std::isfinite(got) && std::isfinite(want[i]))
        d = std::fabs(static_cast<double>(got) - want[i]) / ulp_of(std::max<double>(std::fabs(want[i]), scale(a)), t);
      // In 16-bit dtypes a result within bound of the f32 value may round to the other neighbour.
      const double bound = t == DType::f32 ? ulps : (ulps == 0 ? 0 : 1);
      if (bound == 0 && d == 0 && got == 0 && std::signbit(got) != std::signbit(want[i])) d = 1e9;
      if (d > c.worst) c = {d, i};
      if (d > bound) {
        ADD_FAILURE() << prim->name << " in " << dtype_name(t) << ": at (" << a << ", " << b << ") got " << got
                      << " (0x" << std::hex << bits_of(got) << std::dec << "), the ref backend " << want[i] << ": " << d
                      << " ulp, bound " << bound;
        return;
      }
    }
    std::printf("%-10s %-5s %zu inputs: max %.3f ulp (at x = %.9g)\n", prim->name.c_str(), dtype_name(t), x.size(),
                c.worst, static_cast<double>(x[c.at]));
  }
}

using F1 = float (*)(float);
std::function<float(float, float)> unary(F1 f) {
  return [f](float a, float) { return f(a); };
}

TEST(ElementMath, ExactArithmeticEqualsTheRefBackendBitwise) {
  check_float_op(prims::add(), 2, em::add, 0);
  check_float_op(prims::sub(), 2, em::sub, 0);
  check_float_op(prims::mul(), 2, em::mul, 0);
  check_float_op(prims::div(), 2, em::div, 0);
  check_float_op(prims::maximum(), 2, em::maximum, 0);
  check_float_op(prims::minimum(), 2, em::minimum, 0);
  check_float_op(prims::neg(), 1, unary(em::neg), 0);
  check_float_op(prims::abs(), 1, unary(em::abs), 0);
  check_float_op(prims::sqrt(), 1, unary(em::sqrt), 0);
}

TEST(ElementMath, TranscendentalsAreWithinTheirBoundsOfTheRefBackend) {
  // Bounds against the correctly rounded result: vmath.h's bounds against the exact value plus
  // the half ulp of that rounding.
  check_float_op(prims::exp(), 1, unary(em::exp), 1.5);
  check_float_op(prims::log(), 1, unary(em::log), 1.5);
  check_float_op(prims::tanh(), 1, unary(em::tanh), 2.5);
  check_float_op(prims::sigmoid(), 1, unary(em::sigmoid), 3.0);
  check_float_op(prims::rsqrt(), 1, unary(em::rsqrt), 1.5);  // two roundings
  check_float_op(prims::pow(), 2, em::pow, 1.5);             // the platform's powf
  // silu where sigmoid(x) is a normal float (x >= -87); below it is subnormal and x sigmoid(x)
  // keeps only its few bits (the CPU backend's formula too).
  check_float_op(prims::silu(), 1, unary(em::silu), 4.5, {}, [](float x) { return x < -87.0f; });
  const Attrs erf_form{{"approximate", std::string("erf")}}, tanh_form{{"approximate", std::string("tanh")}};
  // gelu's erf form: within 7 ulp where Phi(x) >= 2^-126 (x >= -12.9); below, Phi's tail is
  // subnormal or 0 and the product loses its precision (it is 0 or a few ulp of 2^-149 there).
  check_float_op(
      prims::gelu(), 1, [](float x, float) { return em::gelu(x, false); }, 7.5, erf_form,
      [](float x) { return x < -12.9f; });
  // The tanh form from x = -1 up; below, the rounding of 2u in float reaches the result.
  check_float_op(
      prims::gelu(), 1, [](float x, float) { return em::gelu(x, true); }, 6.5, tanh_form,
      [](float x) { return x < -1.0f; });
  // gelu_grad is Phi(x) + x phi(x) (the tanh form s + x s (1 - s) z'), which crosses 0 near x = -0.75:
  // its error is bounded in ulps of its larger term.
  const auto erf_terms = [](float x) {
    const double p = 0.5 * std::erfc(-x / std::sqrt(2.0));
    return std::max(p, std::fabs(x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI)));
  };
  const auto tanh_terms = [](float x) {
    const double z = 2 * 0.7978845608028654 * (x + 0.044715 * x * x * x), s = 1 / (1 + std::exp(-z));
    return std::max(s, std::fabs(x * s * (1 - s) * 2 * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x)));
  };
  // The erf form from |x| = 4 on: e^{-x^2 / 2} with x^2 rounded in f32 bounds it relatively (the
  // CPU backend's formula too); GeluGradErfFormTailIsWithinItsRelativeError checks that part.
  check_float_op(
      prims::gelu_grad(), 1, [](float x, float) { return em::gelu_grad(x, false); }, 8.0, erf_form,
      [](float x) { return std::fabs(x) > 4.0f; }, erf_terms);
  check_float_op(
      prims::gelu_grad(), 1, [](float x, float) { return em::gelu_grad(x, true); }, 8.0, tanh_form,
      [](float x) { return x < -1.0f; }, tanh_terms);
}

TEST(ElementMath, GeluGradErfFormTailIsWithinItsRelativeError) {
  for (float x = 4.0f; x < 12.9f; x += 1e-3f)
    for (float sx : {x, -x}) {
      const double exact = 0.5 * std::erfc(-sx / std::sqrt(2.0)) + sx * std::exp(-0.5 * sx * sx) / std::sqrt(2 * M_PI);
      ASSERT_LE(std::fabs(em::gelu_grad(sx, false) - exact), 1e-5 * std::fabs(exact)) << sx;
    }
}

// Below x = -1 the tanh form's error is the formula's (2u rounded in f32), bounded relatively.
TEST(ElementMath, GeluTanhFormBelowMinusOneIsWithinItsRelativeError) {
  for (float x = -1.0f; x > -20.0f; x -= 1e-3f) {
    const double exact = x / (1.0 + std::exp(-2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x)));
    if (std::fabs(exact) < FLT_MIN) break;
    ASSERT_LE(std::fabs(em::gelu(x, true) - exact), 3e-5 * std::fabs(exact)) << x;
  }
}

TEST(ElementMath, ComparisonsAndLogicalOpsEqualTheRefBackend) {
  const std::vector<float> x = float_inputs(), y = shuffled(x);
  const int64_t n = static_cast<int64_t>(x.size());
  struct Cmp {
    const Primitive* prim;
    bool (*f)(float, float);
  };
  const Cmp cmps[] = {{prims::eq(), [](float a, float b) { return a == b; }},
                      {prims::ne(), [](float a, float b) { return a != b; }},
                      {prims::lt(), [](float a, float b) { return a < b; }},
                      {prims::le(), [](float a, float b) { return a <= b; }},
                      {prims::gt(), [](float a, float b) { return a > b; }},
                      {prims::ge(), [](float a, float b) { return a >= b; }},
                      {prims::logical_and(), [](float a, float b) { return a != 0 && b != 0; }},
                      {prims::logical_or(), [](float a, float b) { return a != 0 || b != 0; }}};
  for (const Cmp& c : cmps) {
    const bool logical = c.prim == prims::logical_and() || c.prim == prims::logical_or();
    for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
      if (logical != (t == DType::boolean)) continue;
      std::vector<float> xs = x, ys = y;
      if (t == DType::i32 || t == DType::boolean)
        for (size_t i = 0; i < xs.size(); ++i) {  // small integers, so that many pairs are equal
          xs[i] = static_cast<float>(static_cast<int>(i % 7) - 3);
          ys[i] = static_cast<float>(static_cast<int>((i * 5 + i / 7) % 7) - 3);
        }
      std::vector<std::vector<std::byte>> in{encode(xs, t), encode(ys, t)};
      const std::vector<float> want = run_ref(c.prim, in, {t, t}, DType::boolean, n);
      for (size_t i = 0; i < xs.size(); ++i) {
        const bool got = c.f(em_load(in[0], t, i), em_load(in[1], t, i));
        ASSERT_EQ(got, want[i] != 0) << c.prim->name << " in " << dtype_name(t) << " at " << i;
      }
    }
  }
  // logical_not
  std::vector<std::vector<std::byte>> in{encode({0.0f, 1.0f}, DType::boolean)};
  EXPECT_EQ(run_ref(prims::logical_not(), in, {DType::boolean}, DType::boolean, 2), (std::vector<float>{1, 0}));
}

TEST(ElementMath, IntegerOpsWrapAsTheRefBackend) {
  const int32_t edge[] = {0, 1, -1, 2, -2, 7, -7, 46341, -46341, INT32_MAX, INT32_MIN, INT32_MAX - 1, INT32_MIN + 1};
  std::vector<int32_t> a, b;
  for (int32_t p : edge)
    for (int32_t q : edge) {
      a.push_back(p);
      b.push_back(q);
    }
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) {
    a.push_back(static_cast<int32_t>(rng()));
    b.push_back(static_cast<int32_t>(rng()) >> (i % 31));
  }
  const int64_t n = static_cast<int64_t>(a.size());
  auto bytes = [](const std::vector<int32_t>& v) {
    std::vector<std::byte> r(v.size() * 4);
    std::memcpy(r.data(), v.data(), r.size());
    return r;
  };
  struct Op {
    const Primitive* prim;
    int arity;
    int32_t (*f)(int32_t, int32_t);
  };
  const Op ops[] = {{prims::add(), 2, em::iadd},
                    {prims::sub(), 2, em::isub},
                    {prims::mul(), 2, em::imul},
                    {prims::div(), 2, em::idiv},
                    {prims::maximum(), 2, em::imaximum},
                    {prims::minimum(), 2, em::iminimum},
                    {prims::neg(), 1, [](int32_t x, int32_t) { return em::ineg(x); }},
                    {prims::abs(), 1, [](int32_t x, int32_t) { return em::iabs(x); }}};
  for (const Op& op : ops) {
    std::vector<std::vector<std::byte>> in{bytes(a)};
    if (op.arity == 2) in.push_back(bytes(b));
    std::vector<TensorType> it(op.arity, TensorType{DType::i32, {n}}), ot{TensorType{DType::i32, {n}}};
    Kernel k = (*ref::find_kernel(op.prim))(ref::Spec{it, ot, Attrs{}});
    std::vector<int32_t> out(a.size());
    std::vector<const void*> ip;
    for (const auto& v : in) ip.push_back(v.data());
    void* opp[] = {out.data()};
    k(ip.data(), opp);
    for (size_t i = 0; i < a.size(); ++i)
      ASSERT_EQ(op.f(a[i], b[i]), out[i]) << op.prim->name << "(" << a[i] << ", " << b[i] << ")";
  }
}

// Every cast between the five dtypes, as the header does it: the value held in f32 (or as an
// integer where both sides are integers) stored to the target.
TEST(ElementMath, CastsEqualTheRefBackendBitwise) {
  std::vector<float> x = float_inputs();
  for (int i = -300; i <= 300; ++i) x.push_back(static_cast<float>(i) * 0.5f);
  const int64_t n = static_cast<int64_t>(x.size());
  const DType all[] = {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean};
  for (DType from : all)
    for (DType to : all) {
      const std::vector<std::byte> in = encode(x, from);
      std::vector<TensorType> it{TensorType{from, {n}}}, ot{TensorType{to, {n}}};
      Kernel k = (*ref::find_kernel(prims::cast()))(ref::Spec{it, ot, Attrs{{"dtype", to}}});
      std::vector<std::byte> want(static_cast<size_t>(n * dtype_size(to)));
      const void* ip[] = {in.data()};
      void* op[] = {want.data()};
      k(ip, op);
      std::vector<std::byte> got(want.size());
      for (int64_t i = 0; i < n; ++i) {
        std::byte* g = got.data() + i * dtype_size(to);
        const bool int_path =
            (from == DType::i32 || from == DType::boolean) && (to == DType::i32 || to == DType::boolean);
        const int32_t iv = from == DType::i32 ? reinterpret_cast<const int32_t*>(in.data())[i]
                                              : static_cast<int32_t>(em_load(in, from, static_cast<size_t>(i)));
        const float v = em_load(in, from, static_cast<size_t>(i));
        switch (to) {
          case DType::f32: {
            const float r = from == DType::i32 ? static_cast<float>(iv) : v;
            std::memcpy(g, &r, 4);
            break;
          }
          case DType::bf16: {
            const uint16_t r = em::f32_to_bf16(from == DType::i32 ? static_cast<float>(iv) : v);
            std::memcpy(g, &r, 2);
            break;
          }
          case DType::f16: {
            const uint16_t r = em::f32_to_f16(from == DType::i32 ? static_cast<float>(iv) : v);
            std::memcpy(g, &r, 2);
            break;
          }
          case DType::i32: {
            const int32_t r = int_path ? iv : em::f32_to_i32(v);
            std::memcpy(g, &r, 4);
            break;
          }
          case DType::boolean: {
            const uint8_t r = int_path ? iv != 0 : em::f32_to_bool(v);
            std::memcpy(g, &r, 1);
            break;
          }
        }
        ASSERT_EQ(std::memcmp(g, want.data() + i * dtype_size(to), static_cast<size_t>(dtype_size(to))), 0)
            << "cast " << dtype_name(from) << " -> " << dtype_name(to) << " of " << x[i];
      }
    }
}

TEST(ElementMath, SixteenBitConversionsEqualTheLibrarysAtEveryValue) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t b = static_cast<uint16_t>(h);
    ASSERT_EQ(bits_of(em::bf16_to_f32(b)), bits_of(bf16_to_f32(b))) << h;
    const float f = f16_to_f32(b);
    ASSERT_EQ(bits_of(em::f16_to_f32(b)), bits_of(f)) << h;
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 97) {
    const float f = from_bits(static_cast<uint32_t>(u));
    ASSERT_EQ(em::f32_to_bf16(f), f32_to_bf16(f)) << u;
    ASSERT_EQ(em::f32_to_f16(f), f32_to_f16(f)) << u;
  }
}

// select(c, a, b) through the ref backend (which copies the chosen element's bytes).
TEST(ElementMath, SelectEqualsTheRefBackend) {
  const std::vector<float> x = float_inputs(), y = shuffled(x);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> c(x.size());
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<float>(i % 3 == 0);
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    std::vector<std::vector<std::byte>> in{encode(c, DType::boolean), encode(x, t), encode(y, t)};
    const std::vector<float> want = run_ref(prims::select(), in, {DType::boolean, t, t}, t, n);
    for (size_t i = 0; i < x.size(); ++i) {
      const float got = em_store(c[i] != 0 ? em_load(in[1], t, i) : em_load(in[2], t, i), t);
      ASSERT_EQ(distance(got, want[i], t), 0) << dtype_name(t) << " at " << i;
    }
  }
}

// adamw_update's element against the ref backend's kernel (the f32 chain it defines), bitwise,
// with and without decay, for f32 and bf16 params.
TEST(ElementMath, AdamwUpdateEqualsTheRefBackendBitwise) {
  const int64_t n = 4096;
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> p(n), g(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = nd(rng);
    g[i] = nd(rng) * 1e-2f;
    m[i] = nd(rng) * 1e-3f;
    v[i] = std::fabs(nd(rng)) * 1e-5f;
  }
  p[0] = kInf;  // without decay p inf stays inf; with decay it becomes NaN (inf - inf)
  const float step = 3e-4f, inv_sqrt_bc2 = 1.7f, wd = 3e-6f;
  for (DType pt : {DType::f32, DType::bf16})
    for (int64_t decay : {0, 1}) {
      const double b1 = 0.9, b2 = 0.95, eps = 1e-8;
      std::vector<TensorType> it{TensorType{pt, {n}},         TensorType{pt, {n}},        TensorType{DType::f32, {n}},
                                 TensorType{DType::f32, {n}}, TensorType{DType::f32, {}}, TensorType{DType::f32, {}}};
      if (decay) it.push_back(TensorType{DType::f32, {}});
      std::vector<TensorType> ot{TensorType{pt, {n}}, TensorType{DType::f32, {n}}, TensorType{DType::f32, {n}}};
      const Attrs attrs{{"beta1", b1}, {"beta2", b2}, {"eps", eps}, {"decay", decay}};
      Kernel k = (*ref::find_kernel(prims::adamw_update()))(ref::Spec{it, ot, attrs});
      const std::vector<std::byte> pb = encode(p, pt), gb = encode(g, pt);
      std::vector<std::byte> po(pb.size());
      std::vector<float> mo(n), vo(n);
      const void* in[] = {pb.data(), gb.data(), m.data(), v.data(), &step, &inv_sqrt_bc2, &wd};
      void* out[] = {po.data(), mo.data(), vo.data()};
      k(in, out);
      for (int64_t i = 0; i < n; ++i) {
        const size_t e = static_cast<size_t>(i);
        const em::AdamW r =
            em::adamw(em_load(pb, pt, e), em_load(gb, pt, e), m[i], v[i], static_cast<float>(b1),
                      static_cast<float>(1.0 - b1), static_cast<float>(b2), static_cast<float>(1.0 - b2),
                      static_cast<float>(eps), step, inv_sqrt_bc2, decay != 0, wd);
        ASSERT_EQ(bits_of(r.m), bits_of(mo[i])) << i;
        ASSERT_EQ(bits_of(r.v), bits_of(vo[i])) << i;
        ASSERT_EQ(distance(em_store(r.p, pt), em_load(po, pt, e), pt), 0)
            << dtype_name(pt) << " decay " << decay << " at " << i;
      }
    }
}

// ---- random streams against the CPU backend ----------------------------------------------------

std::vector<std::byte> run_cpu(const Primitive* prim, const std::vector<TensorType>& in_t, const TensorType& out_t,
                               const Attrs& attrs, const std::vector<const void*>& in) {
  const std::vector<TensorType> outs{out_t};
  const cpu::KernelSpec spec{in_t, outs, attrs};
  Kernel k = (*cpu::find_kernel(prim))(spec);
  std::vector<std::byte> out(static_cast<size_t>(out_t.nbytes()));
  // The kernel's working memory follows its result, as the runtime hands it over.
  std::vector<float> scratch(static_cast<size_t>(cpu::scratch_bytes(prim, spec) / 4 + 16));
  void* op[] = {out.data(), scratch.data()};
  k(in.data(), op);
  return out;
}

TEST(ElementMath, UniformDrawsEqualTheCpuBackendBitwise) {
  const int32_t key[2] = {12345, -678};
  const int64_t rows = 37, cols = 129;
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    for (const auto& [lo, hi] : {std::pair{0.0, 1.0}, std::pair{-3.0, 0.999}, std::pair{0.9990234375, 1.0}}) {
      const Attrs attrs{{"shape", std::vector<int64_t>{rows, cols}}, {"dtype", t}, {"lo", lo}, {"hi", hi}};
      const std::vector<std::byte> want =
          run_cpu(prims::random_uniform(), {TensorType{DType::i32, {2}}}, TensorType{t, {rows, cols}}, attrs, {key});
      const float flo = static_cast<float>(lo), fhi = static_cast<float>(hi);
      const int code = t == DType::bf16 ? em::kBF16 : t == DType::f16 ? em::kF16 : em::kF32;
      const em::UniformBounds bounds = em::uniform_bounds(code, flo, fhi);  // once per kernel
      for (int64_t i = 0; i < rows * cols; ++i) {
        const float v = em::uniform_in_range(em::uniform(static_cast<uint64_t>(i), static_cast<uint32_t>(key[0]),
                                                         static_cast<uint32_t>(key[1]), flo, fhi),
                                             code, flo, fhi, bounds);
        ASSERT_EQ(bits_of(v), bits_of(static_cast<float>(ref::load(want.data(), t, i))))
            << dtype_name(t) << " [" << lo << ", " << hi << ") at " << i;
      }
    }
}

TEST(ElementMath, NormalDrawsAndFoldInEqualTheCpuBackend) {
  const int32_t key[2] = {-5, 99};
  const int64_t n = 4099;
  const Attrs attrs{{"shape", std::vector<int64_t>{n}}, {"dtype", DType::f32}};
  const std::vector<std::byte> want =
      run_cpu(prims::random_normal(), {TensorType{DType::i32, {2}}}, TensorType{DType::f32, {n}}, attrs, {key});
  for (int64_t i = 0; i < n; ++i) {
    const float got =
        em::normal(static_cast<uint64_t>(i), static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]));
    ASSERT_EQ(bits_of(got), bits_of(reinterpret_cast<const float*>(want.data())[i])) << i;
  }
  for (int64_t data : {int64_t{0}, int64_t{1}, int64_t{7} << 40, int64_t{-3}}) {
    const std::vector<std::byte> k = run_cpu(prims::fold_in(), {TensorType{DType::i32, {2}}},
                                             TensorType{DType::i32, {2}}, Attrs{{"data", data}}, {key});
    const em::Philox b =
        em::fold_in(static_cast<uint32_t>(key[0]), static_cast<uint32_t>(key[1]), static_cast<uint64_t>(data));
    EXPECT_EQ(b.w[0], reinterpret_cast<const uint32_t*>(k.data())[0]);
    EXPECT_EQ(b.w[1], reinterpret_cast<const uint32_t*>(k.data())[1]);
  }
}

}  // namespace
}  // namespace px
