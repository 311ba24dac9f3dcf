// The vector transcendentals of src/backend/cpu/vmath.h, as the library compiles them, against the
// double-precision libm over wide input ranges (a stride through every float bit pattern of both
// signs, dense sweeps where the formulas switch, subnormals, huge magnitudes) and at the special
// values: the error bounds stated in vmath.h are asserted here. Also: the elementwise block
// functions the fused loops run (exp, log, tanh, sigmoid, gelu) give these very bits.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backend/cpu/kernel.h"
#include "parallax/backend.h"
#include "backend/cpu/vmath.h"
#include "backend/cpu/vmath_eval.h"

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The unit in the last place of the float binade of |r| (2^-149 for subnormals, FLT_MAX's for
// values beyond it).
double ulp_of(double r) {
  double a = std::fabs(r);
  if (a < FLT_MIN) return std::ldexp(1.0, -149);
  if (a > FLT_MAX) a = FLT_MAX;
  return std::ldexp(1.0, std::ilogb(a) - 23);
}

struct Worst {
  double ulp = 0, subnormal_ulp = 0;  // results of at least FLT_MIN in size, and below it
  float at = 0, sub_at = 0;
  int64_t count = 0;
};

// Error of y against the exact value r in units of the last place of r's binade. An infinite
// result where the exact value is finite counts as FLT_MAX's ulps beyond it, and the other way.
double ulp_error(float y, double r) {
  if (std::isnan(r)) return std::isnan(y) ? 0 : 1e9;
  if (std::isnan(y)) return 1e9;
  // Beyond FLT_MAX and half its ulp the correctly rounded result is infinite.
  const double big = static_cast<double>(FLT_MAX) + ulp_of(FLT_MAX) / 2;
  if (std::fabs(r) >= big) r = std::copysign(std::numeric_limits<double>::infinity(), r);
  if (std::isinf(r) || std::isinf(y)) {
    if (std::isinf(r) && std::isinf(y)) return (r > 0) == (y > 0) ? 0 : 1e9;
    const double yc = std::isinf(y) ? std::copysign(static_cast<double>(FLT_MAX) + ulp_of(FLT_MAX), y) : y;
    const double rc = std::isinf(r) ? std::copysign(static_cast<double>(FLT_MAX) + ulp_of(FLT_MAX), r) : r;
    return std::fabs(yc - rc) / ulp_of(FLT_MAX);
  }
  return std::fabs(static_cast<double>(y) - r) / ulp_of(r);
}

// All the inputs: every `stride`-th float bit pattern of both signs, dense sweeps of [-12, 12]
// and near 0, subnormals, and around the given switch points.
std::vector<float> inputs(const std::vector<float>& switches) {
  std::vector<float> x;
  const uint64_t stride = 251;
  for (uint64_t u = 0; u < 0x7f800000u; u += stride) {
    x.push_back(from_bits(static_cast<uint32_t>(u)));
    x.push_back(-from_bits(static_cast<uint32_t>(u)));
  }
  for (int i = -1200000; i <= 1200000; ++i) x.push_back(static_cast<float>(i) * 1e-5f);
  for (int i = 0; i < 200000; ++i) x.push_back(std::ldexp(1.0f + static_cast<float>(i) / 200000, -30 + i % 30));
  for (uint32_t u = 1; u < 0x00800000u; u += 4099) x.push_back(from_bits(u));
  for (float s : switches) {
    float lo = s, hi = s;
    for (int i = 0; i < 20000; ++i) {
      x.push_back(lo);
      x.push_back(hi);
      x.push_back(-lo);
      x.push_back(-hi);
      lo = std::nextafter(lo, -kInf);
      hi = std::nextafter(hi, kInf);
    }
  }
  return x;
}

Worst measure(const std::string& fn, const std::vector<float>& x, const std::function<double(double)>& ref) {
  std::vector<float> y(x.size());
  EXPECT_TRUE(px::cpu::vecmath_eval(fn, x.data(), y.data(), static_cast<int64_t>(x.size())));
  Worst w;
  for (size_t i = 0; i < x.size(); ++i) {
    const double r = ref(static_cast<double>(x[i]));
    const double e = ulp_error(y[i], r);
    if (std::fabs(r) >= FLT_MIN || std::isnan(r)) {
      if (e > w.ulp) w = {e, w.subnormal_ulp, x[i], w.sub_at, w.count};
    } else if (e > w.subnormal_ulp) {
      w.subnormal_ulp = e;
      w.sub_at = x[i];
    }
    ++w.count;
  }
  std::printf("%-8s %lld inputs: max %.3f ulp (at %.9g), subnormal results max %.3f ulp (at %.9g), %d lanes\n",
              fn.c_str(), static_cast<long long>(w.count), w.ulp, w.at, w.subnormal_ulp, w.sub_at,
              px::cpu::vecmath_lanes());
  return w;
}

float one(const std::string& fn, float x) {
  float y = 0;
  px::cpu::vecmath_eval(fn, &x, &y, 1);
  return y;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

TEST(VecMath, ExpWithinOneUlp) {
  Worst w = measure("exp", inputs({0.0f, 88.72283f, -87.33654f, -103.97208f, 0.3465736f}),
                    [](double x) { return std::exp(x); });
  EXPECT_LE(w.ulp, 1.0);
  EXPECT_LE(w.subnormal_ulp, 2.0);
  EXPECT_TRUE(same_bits(one("exp", 0.0f), 1.0f));
  EXPECT_TRUE(same_bits(one("exp", -0.0f), 1.0f));
  EXPECT_TRUE(same_bits(one("exp", kInf), kInf));
  EXPECT_TRUE(same_bits(one("exp", -kInf), 0.0f));
  EXPECT_TRUE(same_bits(one("exp", 89.0f), kInf));
  EXPECT_TRUE(same_bits(one("exp", -104.0f), 0.0f));
  EXPECT_TRUE(std::isnan(one("exp", kNaN)));
  EXPECT_TRUE(same_bits(one("exp", FLT_TRUE_MIN), 1.0f));
}

TEST(VecMath, LogWithinOneUlp) {
  Worst w = measure("log", inputs({1.0f, 1.41421356f, 0.70710678f}), [](double x) { return std::log(x); });
  EXPECT_LE(w.ulp, 1.0);
  EXPECT_TRUE(same_bits(one("log", 1.0f), 0.0f));
  EXPECT_TRUE(same_bits(one("log", 0.0f), -kInf));
  EXPECT_TRUE(same_bits(one("log", -0.0f), -kInf));
  EXPECT_TRUE(same_bits(one("log", kInf), kInf));
  EXPECT_TRUE(std::isnan(one("log", -1.0f)));
  EXPECT_TRUE(std::isnan(one("log", -kInf)));
  EXPECT_TRUE(std::isnan(one("log", kNaN)));
  EXPECT_NEAR(one("log", FLT_TRUE_MIN), std::log(static_cast<double>(FLT_TRUE_MIN)), 1e-5);
  EXPECT_NEAR(one("log", FLT_MAX), std::log(static_cast<double>(FLT_MAX)), 1e-5);
}

TEST(VecMath, TanhWithinTwoUlp) {
  Worst w = measure("tanh", inputs({0.5f, 9.0f}), [](double x) { return std::tanh(x); });
  EXPECT_LE(w.ulp, 2.0);
  EXPECT_LE(w.subnormal_ulp, 1.0);
  EXPECT_TRUE(same_bits(one("tanh", 0.0f), 0.0f));
  EXPECT_TRUE(same_bits(one("tanh", -0.0f), -0.0f));
  EXPECT_TRUE(same_bits(one("tanh", kInf), 1.0f));
  EXPECT_TRUE(same_bits(one("tanh", -kInf), -1.0f));
  EXPECT_TRUE(same_bits(one("tanh", 10.0f), 1.0f));
  EXPECT_TRUE(same_bits(one("tanh", FLT_TRUE_MIN), FLT_TRUE_MIN));
  EXPECT_TRUE(std::isnan(one("tanh", kNaN)));
}

TEST(VecMath, SigmoidWithinTwoAndAHalfUlp) {
  Worst w = measure("sigmoid", inputs({0.0f, 16.0f, -87.0f}), [](double x) { return 1.0 / (1.0 + std::exp(-x)); });
  EXPECT_LE(w.ulp, 2.5);
  EXPECT_LE(w.subnormal_ulp, 1.0);
  EXPECT_TRUE(same_bits(one("sigmoid", 0.0f), 0.5f));
  EXPECT_TRUE(same_bits(one("sigmoid", kInf), 1.0f));
  EXPECT_TRUE(same_bits(one("sigmoid", -kInf), 0.0f));
  EXPECT_TRUE(std::isnan(one("sigmoid", kNaN)));
}

TEST(VecMath, ErfWithinTwoUlp) {
  Worst w = measure("erf", inputs({0.921875f, 3.92f}), [](double x) { return std::erf(x); });
  EXPECT_LE(w.ulp, 2.0);
  EXPECT_LE(w.subnormal_ulp, 1.0);
  EXPECT_TRUE(same_bits(one("erf", 0.0f), 0.0f));
  EXPECT_TRUE(same_bits(one("erf", -0.0f), -0.0f));
  EXPECT_TRUE(same_bits(one("erf", kInf), 1.0f));
  EXPECT_TRUE(same_bits(one("erf", -kInf), -1.0f));
  EXPECT_TRUE(same_bits(one("erf", 4.0f), 1.0f));
  EXPECT_TRUE(same_bits(one("erf", FLT_MAX), 1.0f));
  EXPECT_TRUE(std::isnan(one("erf", kNaN)));
}

TEST(VecMath, ErfcAndPhiWithinSevenUlp) {
  Worst c = measure("erfc", inputs({0.921875f, 3.92f, 9.0f}), [](double x) { return std::erfc(x); });
  EXPECT_LE(c.ulp, 7.0);
  Worst p =
      measure("phi", inputs({1.3037127f, 5.5f, 12.0f}), [](double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); });
  EXPECT_LE(p.ulp, 7.0);
  EXPECT_TRUE(same_bits(one("erfc", kInf), 0.0f));
  EXPECT_TRUE(same_bits(one("erfc", -kInf), 2.0f));
  EXPECT_TRUE(same_bits(one("erfc", 0.0f), 1.0f));
  EXPECT_TRUE(std::isnan(one("erfc", kNaN)));
  EXPECT_TRUE(same_bits(one("phi", kInf), 1.0f));
  EXPECT_TRUE(same_bits(one("phi", -kInf), 0.0f));
  EXPECT_TRUE(same_bits(one("phi", 0.0f), 0.5f));
  EXPECT_TRUE(same_bits(one("phi", -FLT_MAX), 0.0f));
  EXPECT_TRUE(std::isnan(one("phi", kNaN)));
}

// The block functions that fused loops and unfused nodes run are these functions, bit for bit,
// whatever the position of an element in a tile (tails of every length).
TEST(VecMath, BlockFunctionsUseThem) {
  px::cpu::register_all_kernels();
  std::vector<float> x;
  for (int i = 0; i < 4099; ++i) x.push_back(static_cast<float>(i - 2049) * 0.0123f);
  x.push_back(kNaN);
  x.push_back(kInf);
  x.push_back(-kInf);
  for (const char* fn : {"exp", "log", "tanh", "sigmoid"}) {
    const px::cpu::EltwiseKernel* k = px::cpu::find_eltwise(px::primitive_handle(fn));
    ASSERT_NE(k, nullptr) << fn;
    std::vector<float> want(x.size());
    px::cpu::vecmath_eval(fn, x.data(), want.data(), static_cast<int64_t>(x.size()));
    for (int64_t len : {int64_t{1}, int64_t{7}, int64_t{15}, int64_t{33}, static_cast<int64_t>(x.size())}) {
      for (int64_t off = 0; off + len <= static_cast<int64_t>(x.size()); off += len > 100 ? len : 997) {
        std::vector<float> got(static_cast<size_t>(len));
        const float* in[1] = {x.data() + off};
        const float params[4] = {0, 0, 0, 0};
        k->f32(in, got.data(), len, params);
        for (int64_t i = 0; i < len; ++i)
          ASSERT_TRUE(same_bits(got[i], want[off + i]) || (std::isnan(got[i]) && std::isnan(want[off + i])))
              << fn << " at x=" << x[off + i] << " len " << len;
      }
    }
  }
}

// gelu (erf form: x Phi(x)) and its gradient against double precision, in relative terms where
// the result is of size and absolutely near 0.
TEST(VecMath, GeluErfIsAccurate) {
  px::cpu::register_all_kernels();
  const px::cpu::EltwiseKernel* g = px::cpu::find_eltwise(px::primitive_handle("gelu"));
  const px::cpu::EltwiseKernel* gg = px::cpu::find_eltwise(px::primitive_handle("gelu_grad"));
  ASSERT_TRUE(g && gg);
  std::vector<float> x;
  // Below -12.9, Phi(x) is subnormal: x Phi(x) then keeps only Phi's absolute precision.
  for (int i = -129000; i <= 200000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
  std::vector<float> y(x.size()), dy(x.size());
  const float* in[1] = {x.data()};
  const float erf_mode[1] = {0.0f};
  g->f32(in, y.data(), static_cast<int64_t>(x.size()), erf_mode);
  gg->f32(in, dy.data(), static_cast<int64_t>(x.size()), erf_mode);
  double worst = 0, worst_grad = 0;
  float worst_at = 0, worst_grad_at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i], p = 0.5 * std::erfc(-xd / std::sqrt(2.0));
    const double r = xd * p, rg = p + xd * std::exp(-0.5 * xd * xd) / std::sqrt(2.0 * M_PI);
    if (const double e = ulp_error(y[i], r); e > worst) worst = e, worst_at = x[i];
    // Relative, and absolute around the gradient's zero crossing (x near -0.75).
    if (const double e = std::fabs(dy[i] - rg) / std::max(std::fabs(rg), 1e-2); e > worst_grad)
      worst_grad = e, worst_grad_at = x[i];
  }
  std::printf("gelu(erf) max %.3f ulp (at %.7g) over [-12.9, 20]; gelu_grad max relative error %.3g (at %.7g)\n", worst,
              worst_at, worst_grad, worst_grad_at);
  EXPECT_LE(worst, 7.0);
  EXPECT_LE(worst_grad, 1e-5);
}

}  // namespace

// gelu's tanh form x sigmoid(2u), its gradient, and silu x sigmoid(x) against double precision.
TEST(VecMath, GeluTanhAndSiluAreAccurate) {
  px::cpu::register_all_kernels();
  std::vector<float> x;
  // Below -9.5 (gelu) and -87 (silu) the results approach the subnormal range.
  for (int i = -95000; i <= 200000; ++i) x.push_back(static_cast<float>(i) * 1e-4f);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size()), dy(x.size()), sy(x.size());
  const float* in[1] = {x.data()};
  const float tanh_mode[1] = {1.0f};
  px::cpu::find_eltwise(px::primitive_handle("gelu"))->f32(in, y.data(), n, tanh_mode);
  px::cpu::find_eltwise(px::primitive_handle("gelu_grad"))->f32(in, dy.data(), n, tanh_mode);
  px::cpu::find_eltwise(px::primitive_handle("silu"))->f32(in, sy.data(), n, tanh_mode);
  const double c = std::sqrt(2.0 / M_PI), a = 0.044715;
  double worst = 0, worst_tail = 0, worst_grad = 0, worst_silu = 0;
  float worst_at = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double xd = x[i], u = c * (xd + a * xd * xd * xd), t = std::tanh(u);
    // Below x = -1 the rounding of the argument 2u in float (a few ulp of 2u) reaches the result
    // as |2u| times that (sigmoid(2u) ~ e^{2u}): the formula's error, bounded relatively there.
    const double r = xd / (1 + std::exp(-2 * u));
    if (xd >= -1) {
      if (const double e = ulp_error(y[i], r); e > worst) worst = e, worst_at = x[i];
    } else {
      worst_tail = std::max(worst_tail, std::fabs(y[i] - r) / std::fabs(r));
    }
    const double g = 0.5 * (1 + t) + 0.5 * xd * (1 - t * t) * c * (1 + 3 * a * xd * xd);
    worst_grad = std::max(worst_grad, std::fabs(dy[i] - g) / std::max(std::fabs(g), 1e-2));
    worst_silu = std::max(worst_silu, ulp_error(sy[i], xd / (1 + std::exp(-xd))));
  }
  std::printf("gelu(tanh) max %.3f ulp (at %.7g), gelu_grad(tanh) max relative error %.3g, silu max %.3f ulp\n", worst,
              worst_at, worst_grad, worst_silu);
  EXPECT_LE(worst, 6.0);
  EXPECT_LE(worst_grad, 1e-5);
  EXPECT_LE(worst_silu, 4.0);
}

// Far in the tails gelu's gradient is 1 (x > 0) or 0 (x < 0) in both forms, not NaN: the tanh
// form's second term is 0 there, also where x^3 overflows (0 times inf).
TEST(VecMath, GeluGradIsFiniteFarInTheTails) {
  px::cpu::register_all_kernels();
  const std::vector<float> x = {1e5f, -1e5f, 1e13f, -1e13f, 1e20f, -1e20f, 3e38f, -3e38f, 200.0f, -200.0f};
  for (const float mode : {0.0f, 1.0f}) {
    std::vector<float> dy(x.size());
    const float* in[1] = {x.data()};
    const float params[1] = {mode};
    px::cpu::find_eltwise(px::primitive_handle("gelu_grad"))->f32(in, dy.data(), static_cast<int64_t>(x.size()), params);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(dy[i], x[i] > 0 ? 1.0f : 0.0f) << "x " << x[i] << " tanh " << mode;
  }
}

// The row helpers of the row kernels, at the test's own vector width: every length up to a few
// vectors (so every tail), against double sums; the exponentials written in place.
TEST(VecMath, RowHelpersCoverEveryTail) {
  namespace vm = px::cpu::vecmath;
  for (int64_t n = 0; n <= 3 * vm::kLanes + 1; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[i] = std::sin(0.7f * static_cast<float>(i)) * 4.0f;
    double sum = 0, esum = 0;
    float mx = -INFINITY;
    for (float v : x) sum += v, mx = std::max(mx, v);
    for (float v : x) esum += std::exp(static_cast<double>(v) - mx);
    EXPECT_NEAR(vm::row_sum(x.data(), n), sum, 1e-5 * (1 + n)) << n;
    EXPECT_EQ(vm::row_max(x.data(), n), mx) << n;
    std::vector<float> y = x;
    EXPECT_NEAR(vm::exp_shift_sum(y.data(), mx, y.data(), n), esum, 1e-6 * (1 + esum)) << n;
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], std::exp(static_cast<double>(x[i]) - mx), 1e-6) << n << " " << i;
  }
  // A NaN is passed over by the maximum and reaches the sum.
  std::vector<float> x(37, 1.0f);
  x[20] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(vm::row_max(x.data(), 37), 1.0f);
  EXPECT_TRUE(std::isnan(vm::exp_shift_sum(x.data(), 1.0f, nullptr, 37)));
}
