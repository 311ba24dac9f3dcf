// Elementwise primitives: numerics against double-precision references (fusion on and off, all
// dtypes), the exact integer path, broadcasting, operators, gradients and errors.
#include <climits>
#include <cmath>
#include <functional>

#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval;
using testing::eval1;
using testing::random_array;
using testing::throws_error;

const CompileOptions kUnfused{.fuse_elementwise = false};

// Tolerances for results stored in a dtype: 16-bit floats round the result once more.
double rtol_of(DType d) { return d == DType::bf16 ? 8e-3 : d == DType::f16 ? 1e-3 : 2e-6; }
double atol_of(DType d) { return d == DType::bf16 ? 1e-2 : d == DType::f16 ? 1e-3 : 1e-6; }

// Runs fn fused and unfused; both must agree exactly, and the first result is returned.
Array eval_both(const TracedFn& fn, const std::vector<Array>& in) {
  Array fused = eval1(fn, in);
  Array unfused = eval1(fn, in, kUnfused);
  EXPECT_EQ(fused.type(), unfused.type());
  EXPECT_TRUE(all_close(fused.to_f32(), unfused.to_f32(), 0, 0)) << "fused and unfused runs differ";
  return fused;
}

// Numpy broadcasting of reference data: the index into a [shape] array for a result index.
int64_t bcast_index(const Shape& from, const Shape& to, int64_t flat) {
  int64_t idx = 0, stride = 1;
  for (int d = static_cast<int>(to.size()) - 1; d >= 0; --d) {
    int64_t coord = flat % to[d];
    flat /= to[d];
    int k = d - static_cast<int>(to.size() - from.size());
    if (k >= 0) {
      if (from[k] != 1) idx += coord * stride;
      stride *= from[k];
    }
  }
  return idx;
}

using UnaryRef = std::function<double(double)>;
using BinaryRef = std::function<double(double, double)>;

struct UnaryCase {
  const char* name;
  std::function<Tensor(const Tensor&)> op;
  UnaryRef ref;
  float lo, hi;
};

std::vector<UnaryCase> unary_cases() {
  return {
      {"neg", [](const Tensor& x) { return neg(x); }, [](double x) { return -x; }, -3, 3},
      {"exp", [](const Tensor& x) { return exp(x); }, [](double x) { return std::exp(x); }, -10, 10},
      {"log", [](const Tensor& x) { return log(x); }, [](double x) { return std::log(x); }, 0.01f, 50},
      {"tanh", [](const Tensor& x) { return tanh(x); }, [](double x) { return std::tanh(x); }, -6, 6},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, [](double x) { return std::sqrt(x); }, 0, 9},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, [](double x) { return 1 / std::sqrt(x); }, 0.01f, 9},
      {"abs", [](const Tensor& x) { return abs(x); }, [](double x) { return std::fabs(x); }, -3, 3},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, [](double x) { return 1 / (1 + std::exp(-x)); },
       -20, 20},
      {"square", [](const Tensor& x) { return square(x); }, [](double x) { return x * x; }, -3, 3},
  };
}

const std::vector<Shape> kShapes = {{7, 13}, {}, {1, 5}, {0, 3}, {3, 0, 2}, {97, 101}};

TEST(Elementwise, UnaryMatchesReferenceForAllFloatDtypes) {
  for (const UnaryCase& c : unary_cases())
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (const Shape& s : kShapes) {
        SCOPED_TRACE(std::string(c.name) + " " + type_str({dt, s}));
        Array x = random_array(s, dt, 7, c.lo, c.hi);
        Array y = eval_both([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0])}; }, {x});
        ASSERT_EQ(y.type(), x.type());
        std::vector<float> xv = x.to_f32(), want(xv.size());
        for (size_t i = 0; i < xv.size(); ++i) want[i] = static_cast<float>(c.ref(xv[i]));
        EXPECT_TRUE(all_close(y.to_f32(), want, atol_of(dt), rtol_of(dt)));
      }
}

TEST(Elementwise, TranscendentalsAreAccurateToAFewUlpOverWideRanges) {
  // A dense sweep, including tails where exp/sigmoid underflow to subnormals or overflow.
  std::vector<float> v;
  for (float x = -120.0f; x <= 120.0f; x += 0.0173f) v.push_back(x);
  Array x = Array::from_f32(v, {static_cast<int64_t>(v.size())});
  std::vector<float> pos;
  for (float p = 1e-30f; p < 1e30f; p *= 1.0137f) pos.push_back(p);
  Array xp = Array::from_f32(pos, {static_cast<int64_t>(pos.size())});
  auto ulp_err = [](float got, double want) {
    float w = static_cast<float>(want);
    if (std::isinf(w) || std::isnan(w)) return got == w || (std::isnan(got) && std::isnan(w)) ? 0.0 : 1e9;
    double ulp = std::max<double>(std::nextafter(std::fabs(w), INFINITY) - std::fabs(w), 1.401298464e-45);
    return std::fabs(got - want) / ulp;
  };
  struct Case {
    const char* name;
    std::function<Tensor(const Tensor&)> op;
    UnaryRef ref;
    bool positive;
  };
  std::vector<Case> cases = {
      {"exp", [](const Tensor& t) { return exp(t); }, [](double a) { return std::exp(a); }, false},
      {"tanh", [](const Tensor& t) { return tanh(t); }, [](double a) { return std::tanh(a); }, false},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, [](double a) { return 1 / (1 + std::exp(-a)); }, false},
      {"log", [](const Tensor& t) { return log(t); }, [](double a) { return std::log(a); }, true},
  };
  for (const Case& c : cases) {
    const Array& in = c.positive ? xp : x;
    Array y = eval1([&](const std::vector<Tensor>& t) { return std::vector<Tensor>{c.op(t[0])}; }, {in});
    std::vector<float> iv = in.to_f32(), yv = y.to_f32();
    double worst = 0;
    for (size_t i = 0; i < iv.size(); ++i) worst = std::max(worst, ulp_err(yv[i], c.ref(iv[i])));
    EXPECT_LE(worst, 4.0) << c.name;
  }
}

TEST(Elementwise, SpecialValues) {
  const float inf = INFINITY, nan = NAN;
  Array x = Array::from_f32({0.0f, -0.0f, inf, -inf, nan, 1e-45f, -1.0f}, {7});
  std::vector<Array> r = eval(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{exp(in[0]), log(in[0]), tanh(in[0]), sigmoid(in[0]), sqrt(in[0])};
      },
      {x});
  EXPECT_TRUE(all_close(r[0].to_f32(), {1, 1, inf, 0, nan, 1, std::exp(-1.0f)}));
  std::vector<float> lg = r[1].to_f32();
  EXPECT_EQ(lg[0], -inf);
  EXPECT_EQ(lg[1], -inf);
  EXPECT_EQ(lg[2], inf);
  EXPECT_TRUE(std::isnan(lg[3]) && std::isnan(lg[4]) && std::isnan(lg[6]));
  EXPECT_NEAR(lg[5], std::log(static_cast<double>(1e-45f)), 1e-4);
  EXPECT_TRUE(all_close(r[2].to_f32(), {0, -0.0f, 1, -1, nan, 1e-45f, std::tanh(-1.0f)}));
  EXPECT_TRUE(all_close(r[3].to_f32(), {0.5f, 0.5f, 1, 0, nan, 0.5f, 1 / (1 + std::exp(1.0f))}));
  std::vector<float> sq = r[4].to_f32();
  EXPECT_EQ(sq[2], inf);
  EXPECT_TRUE(std::isnan(sq[6]));
}

struct BinaryCase {
  const char* name;
  std::function<Tensor(const Tensor&, const Tensor&)> op;
  BinaryRef ref;
  float lo, hi;  // operand range (pow keeps its base positive)
};

std::vector<BinaryCase> binary_cases() {
  return {
      {"add", [](const Tensor& a, const Tensor& b) { return a + b; }, [](double a, double b) { return a + b; }, -2, 2},
      {"sub", [](const Tensor& a, const Tensor& b) { return a - b; }, [](double a, double b) { return a - b; }, -2, 2},
      {"mul", [](const Tensor& a, const Tensor& b) { return a * b; }, [](double a, double b) { return a * b; }, -2, 2},
      {"div", [](const Tensor& a, const Tensor& b) { return a / b; }, [](double a, double b) { return a / b; }, 0.5f,
       3},
      {"pow", [](const Tensor& a, const Tensor& b) { return pow(a, b); },
       [](double a, double b) { return std::pow(a, b); }, 0.1f, 3},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); },
       [](double a, double b) { return std::max(a, b); }, -2, 2},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); },
       [](double a, double b) { return std::min(a, b); }, -2, 2},
  };
}

const std::vector<std::pair<Shape, Shape>> kPairs = {
    {{7, 13}, {7, 13}}, {{3, 1}, {1, 4}}, {{}, {5, 2}}, {{4}, {3, 4}}, {{0, 3}, {1, 3}}, {{2, 1, 3}, {4, 1}},
    {{1}, {}},          {{97, 101}, {101}}};

TEST(Elementwise, BinaryBroadcastsAndMatchesReference) {
  for (const BinaryCase& c : binary_cases())
    for (DType dt : {DType::f32, DType::bf16, DType::f16})
      for (auto [sa, sb] : kPairs) {
        SCOPED_TRACE(std::string(c.name) + " " + type_str({dt, sa}) + " " + type_str({dt, sb}));
        Array a = random_array(sa, dt, 3, c.lo, c.hi), b = random_array(sb, dt, 4, c.lo, c.hi);
        Array y = eval_both(
            [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0], in[1])}; }, {a, b});
        Shape out = sa.size() >= sb.size() ? sa : sb;
        for (size_t i = 0; i < out.size(); ++i) {
          int64_t da = i + sa.size() >= out.size() ? sa[i + sa.size() - out.size()] : 1;
          int64_t db = i + sb.size() >= out.size() ? sb[i + sb.size() - out.size()] : 1;
          out[i] = da == 1 ? db : da;
        }
        ASSERT_EQ(y.type(), (TensorType{dt, out}));
        std::vector<float> av = a.to_f32(), bv = b.to_f32(), want(static_cast<size_t>(numel(out)));
        for (int64_t i = 0; i < numel(out); ++i)
          want[i] = static_cast<float>(c.ref(av[bcast_index(sa, out, i)], bv[bcast_index(sb, out, i)]));
        EXPECT_TRUE(all_close(y.to_f32(), want, atol_of(dt), rtol_of(dt)));
      }
}

TEST(Elementwise, MaximumAndMinimumPropagateNaN) {
  Array a = Array::from_f32({NAN, 1, 2}, {3}), b = Array::from_f32({1, NAN, 3}, {3});
  auto r = eval([](const std::vector<Tensor>& in) { return std::vector<Tensor>{maximum(in[0], in[1]), minimum(in[0], in[1])}; },
                {a, b});
  for (const Array& y : r) {
    std::vector<float> v = y.to_f32();
    EXPECT_TRUE(std::isnan(v[0]) && std::isnan(v[1]));
  }
  EXPECT_EQ(r[0].to_f32()[2], 3);
  EXPECT_EQ(r[1].to_f32()[2], 2);
}

TEST(Elementwise, ComparisonsReturnBool) {
  using Cmp = std::function<Tensor(const Tensor&, const Tensor&)>;
  std::vector<std::pair<Cmp, std::function<bool(float, float)>>> cases = {
      {[](auto& a, auto& b) { return equal(a, b); }, [](float a, float b) { return a == b; }},
      {[](auto& a, auto& b) { return not_equal(a, b); }, [](float a, float b) { return a != b; }},
      {[](auto& a, auto& b) { return less(a, b); }, [](float a, float b) { return a < b; }},
      {[](auto& a, auto& b) { return less_equal(a, b); }, [](float a, float b) { return a <= b; }},
      {[](auto& a, auto& b) { return greater(a, b); }, [](float a, float b) { return a > b; }},
      {[](auto& a, auto& b) { return greater_equal(a, b); }, [](float a, float b) { return a >= b; }},
  };
  for (DType dt : {DType::f32, DType::bf16, DType::i32}) {
    // Small integer-valued data so that ties occur.
    Array a = random_array({7, 13}, DType::i32, 11, -3, 3).astype(dt);
    Array b = random_array({13}, DType::i32, 12, -3, 3).astype(dt);
    std::vector<float> av = a.to_f32(), bv = b.to_f32();
    for (size_t c = 0; c < cases.size(); ++c) {
      SCOPED_TRACE(std::to_string(c) + " " + dtype_name(dt));
      Array y = eval_both(
          [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{cases[c].first(in[0], in[1])}; }, {a, b});
      ASSERT_EQ(y.dtype(), DType::boolean);
      std::vector<int32_t> got = y.to_i32();
      for (int64_t i = 0; i < 7 * 13; ++i)
        ASSERT_EQ(got[i], cases[c].second(av[i], bv[i % 13])) << "element " << i;
    }
  }
}

TEST(Elementwise, LogicalOps) {
  Array a = Array::from_f32({0, 0, 1, 1}, {4}, DType::boolean), b = Array::from_f32({0, 1, 0, 1}, {4}, DType::boolean);
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{logical_and(in[0], in[1]), logical_or(in[0], in[1]), logical_not(in[0])};
      },
      {a, b});
  EXPECT_EQ(r[0].to_i32(), (std::vector<int32_t>{0, 0, 0, 1}));
  EXPECT_EQ(r[1].to_i32(), (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(r[2].to_i32(), (std::vector<int32_t>{1, 1, 0, 0}));
  // Logical results of float comparisons, fused with them.
  Array x = random_array({5, 9}, DType::f32, 5);
  Array y = eval_both(
      [](const std::vector<Tensor>& in) {
        Tensor z = zeros_like(in[0]);
        return std::vector<Tensor>{logical_or(logical_not(greater(in[0], z)), less(in[0], z + 0.5))};
      },
      {x});
  std::vector<float> xv = x.to_f32();
  std::vector<int32_t> got = y.to_i32();
  for (size_t i = 0; i < xv.size(); ++i) EXPECT_EQ(got[i], !(xv[i] > 0) || xv[i] < 0.5f);
}

TEST(Elementwise, WhereBroadcastsAllThree) {
  Array c = Array::from_f32({1, 0, 1}, {3, 1}, DType::boolean);
  Array a = random_array({1, 4}, DType::f32, 1), b = random_array({}, DType::f32, 2);
  Array y = eval_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[2])}; },
                      {c, a, b});
  ASSERT_EQ(y.shape(), (Shape{3, 4}));
  std::vector<float> av = a.to_f32(), bv = b.to_f32(), got = y.to_f32();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(got[i * 4 + j], i != 1 ? av[j] : bv[0]);
  // Integer branches take the exact path.
  Array ia = Array::from_i32({16777217, -16777219}, {2}), ib = Array::from_i32({5, 6}, {2});
  Array ic = Array::from_f32({1, 1}, {2}, DType::boolean);
  Array iy = eval_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[2])}; },
                       {ic, ia, ib});
  EXPECT_EQ(iy.to_i32(), (std::vector<int32_t>{16777217, -16777219}));
}

TEST(Elementwise, IntegerOpsAreExactAboveTwoToThe24) {
  // Values f32 cannot represent: any detour through float would change them.
  std::vector<int32_t> av = {16777217, -16777219, 2147483647, -7, 7, 100000007, INT_MIN, 0};
  std::vector<int32_t> bv = {3, 16777216, 1, 2, -2, -100000006, -1, 5};
  Array a = Array::from_i32(av, {8}), b = Array::from_i32(bv, {8});
  auto wrap = [](int64_t v) { return static_cast<int32_t>(static_cast<uint32_t>(v)); };
  for (const CompileOptions& opt : {CompileOptions{}, kUnfused}) {
    auto r = eval(
        [](const std::vector<Tensor>& in) {
          const Tensor &x = in[0], &y = in[1];
          return std::vector<Tensor>{x + y,          x - y, x * y, x / y, maximum(x, y), minimum(x, y), -x, abs(x),
                                     equal(x, x + 1), x * 3 + 1};
        },
        {a, b}, opt);
    EXPECT_EQ(r[0].dtype(), DType::i32);
    EXPECT_EQ(r[8].dtype(), DType::boolean);
    for (size_t i = 0; i < av.size(); ++i) {
      int64_t x = av[i], y = bv[i];
      EXPECT_EQ(r[0].to_i32()[i], wrap(x + y)) << i;
      EXPECT_EQ(r[1].to_i32()[i], wrap(x - y)) << i;
      EXPECT_EQ(r[2].to_i32()[i], wrap(x * y)) << i;
      EXPECT_EQ(r[3].to_i32()[i], y == -1 ? wrap(-x) : static_cast<int32_t>(x / y)) << i;  // truncating
      EXPECT_EQ(r[4].to_i32()[i], std::max(x, y)) << i;
      EXPECT_EQ(r[5].to_i32()[i], std::min(x, y)) << i;
      EXPECT_EQ(r[6].to_i32()[i], wrap(-x)) << i;
      EXPECT_EQ(r[7].to_i32()[i], wrap(std::abs(x))) << i;
      EXPECT_EQ(r[8].to_i32()[i], 0) << i;  // x == x + 1 is false even where f32 would round
      EXPECT_EQ(r[9].to_i32()[i], wrap(x * 3 + 1)) << i;
    }
  }
  // Division by zero does not trap: it gives 0.
  Array z = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] / in[1]}; },
                  {Array::from_i32({5, -5}, {2}), Array::from_i32({0, 0}, {2})});
  EXPECT_EQ(z.to_i32(), (std::vector<int32_t>{0, 0}));
}

TEST(Elementwise, IntegerPathOnLargeArrays) {
  // Crosses many tiles (and threads) and mixes bool operands into the i32 path.
  int64_t n = 50000;
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<int32_t>(16777216 + i * 3);
  Array a = Array::from_i32(v, {n});
  Array y = eval1(
      [](const std::vector<Tensor>& in) {
        Tensor odd = not_equal(in[0] - (in[0] / 2) * 2, zeros_like(in[0]));
        return std::vector<Tensor>{where(odd, in[0] + 1, in[0])};
      },
      {a});
  std::vector<int32_t> got = y.to_i32();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], v[i] % 2 ? v[i] + 1 : v[i]) << i;
}

TEST(Elementwise, CastRoundsLikeTheTargetDtype) {
  std::vector<float> v = {1.0f, 1.00390625f, 1.01171875f, -2.7f, 2.5f, 65519.0f, 65520.0f, 1e-6f, 3e-8f, -0.0f,
                          1e30f, -1e30f, 0.33333334f, 1.0009765625f + 1e-7f, 5.9604645e-8f, 2.9802322e-8f};
  Array x = Array::from_f32(v, {static_cast<int64_t>(v.size())});
  for (DType to : {DType::bf16, DType::f16}) {
    // Round trip within one fused group: the cast's own rounding decides the value.
    Array y = eval_both(
        [to](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(cast(in[0], to), DType::f32) * 1.0}; },
        {x});
    EXPECT_TRUE(all_close(y.to_f32(), x.astype(to).to_f32(), 0, 0)) << dtype_name(to);
    Array z = eval_both([to](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(in[0], to)}; }, {x});
    EXPECT_EQ(z.dtype(), to);
    EXPECT_TRUE(all_close(z.to_f32(), x.astype(to).to_f32(), 0, 0)) << dtype_name(to);
  }
  std::vector<float> small = {-2.7f, 2.7f, -0.5f, 0.0f, 1e6f + 0.5f, 3.0f};
  Array xs = Array::from_f32(small, {6});
  Array yi = eval_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(in[0], DType::i32)}; }, {xs});
  EXPECT_EQ(yi.to_i32(), (std::vector<int32_t>{-2, 2, 0, 0, 1000000, 3}));
  Array yb =
      eval_both([](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(in[0], DType::boolean)}; }, {xs});
  EXPECT_EQ(yb.to_i32(), (std::vector<int32_t>{1, 1, 1, 0, 1, 1}));
  // Truncation inside a fused chain (cast to i32 then back to f32).
  Array yt = eval_both(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{cast(cast(in[0], DType::i32), DType::f32) + 0.0}; },
      {xs});
  EXPECT_TRUE(all_close(yt.to_f32(), {-2, 2, 0, 0, 1000000, 3}, 0, 0));
  // i32 <-> bool stays exact; i32 -> f32 rounds as a float.
  Array ib = Array::from_i32({0, 3, -16777217}, {3});
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{cast(in[0], DType::boolean), cast(cast(in[0], DType::boolean), DType::i32),
                                   cast(in[0], DType::f32)};
      },
      {ib});
  EXPECT_EQ(r[0].to_i32(), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(r[1].to_i32(), (std::vector<int32_t>{0, 1, 1}));
  EXPECT_TRUE(all_close(r[2].to_f32(), {0, 3, -16777216.0f}, 0, 0));
}

TEST(Elementwise, CastToSameDtypeIsTheTensorItself) {
  trace(
      [](const std::vector<Tensor>& in) {
        EXPECT_EQ(cast(in[0], DType::f32).id(), in[0].id());
        EXPECT_NE(cast(in[0], DType::bf16).id(), in[0].id());
        return std::vector<Tensor>{in[0]};
      },
      {{DType::f32, {2}}});
}

TEST(Elementwise, ScalarOperandsTakeTheTensorDtype) {
  Array x = random_array({3, 5}, DType::bf16, 9, 0.5f, 2);
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        const Tensor& t = in[0];
        return std::vector<Tensor>{t + 2.0, 2.0 - t, t * 3.0, 1.0 / t, t - 1.0, 3.0 * t, t / 4.0, 1.0 + t, -t};
      },
      {x});
  std::vector<float> xv = x.to_f32();
  std::vector<std::function<double(double)>> refs = {
      [](double t) { return t + 2; }, [](double t) { return 2 - t; }, [](double t) { return t * 3; },
      [](double t) { return 1 / t; }, [](double t) { return t - 1; }, [](double t) { return 3 * t; },
      [](double t) { return t / 4; }, [](double t) { return 1 + t; }, [](double t) { return -t; }};
  for (size_t k = 0; k < refs.size(); ++k) {
    ASSERT_EQ(r[k].dtype(), DType::bf16) << k;
    std::vector<float> want;
    for (float t : xv) want.push_back(static_cast<float>(refs[k](t)));
    EXPECT_TRUE(all_close(r[k].to_f32(), want, 1e-2, 8e-3)) << k;
  }
  Array xi = Array::from_i32({7, -7, 16777217}, {3});
  auto ri = eval([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] / 2.0, in[0] + 1.0}; }, {xi});
  EXPECT_EQ(ri[0].dtype(), DType::i32);
  EXPECT_EQ(ri[0].to_i32(), (std::vector<int32_t>{3, -3, 8388608}));
  EXPECT_EQ(ri[1].to_i32(), (std::vector<int32_t>{8, -6, 16777218}));
}

TEST(Elementwise, ChainsFuseIntoOneGroup) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        const Tensor& x = in[0];
        return std::vector<Tensor>{tanh(x * 0.5 + 1.0) * sigmoid(x) - exp(-square(x)) / (abs(x) + 1.0)};
      },
      {{DType::f32, {33, 65}}});
  auto fused = Executable::compile(*g);
  auto unfused = Executable::compile(*g, kUnfused);
  EXPECT_EQ(fused->num_steps(), 1) << fused->summary();
  EXPECT_GT(unfused->num_steps(), 5);
  Array x = random_array({33, 65}, DType::f32, 21, -3, 3);
  std::vector<float> a = fused->run({x})[0].to_f32(), b = unfused->run({x})[0].to_f32();
  std::vector<float> xv = x.to_f32(), want;
  for (float t : xv)
    want.push_back(static_cast<float>(std::tanh(t * 0.5 + 1) / (1 + std::exp(-t)) -
                                      std::exp(-(double)t * t) / (std::fabs(t) + 1)));
  EXPECT_TRUE(all_close(a, want, 1e-6, 1e-5));
  EXPECT_TRUE(all_close(b, a, 0, 0));
}

TEST(Elementwise, NonContiguousOperands) {
  Array a = random_array({5, 7}, DType::f32, 1), b = random_array({7, 5}, DType::f32, 2);
  Array y = eval_both(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * transpose(in[1], {1, 0}) + 1.0}; },
      {a, b});
  std::vector<float> av = a.to_f32(), bv = b.to_f32(), want;
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 7; ++j) want.push_back(av[i * 7 + j] * bv[j * 5 + i] + 1.0f);
  EXPECT_TRUE(all_close(y.to_f32(), want));
}

TEST(Elementwise, StopGradientAndTagAreIdentities) {
  Array x = random_array({4, 3}, DType::f32, 3);
  auto r = eval([](const std::vector<Tensor>& in) { return std::vector<Tensor>{stop_gradient(in[0]), tag(in[0], "h")}; },
                {x});
  EXPECT_TRUE(all_close(r[0].to_f32(), x.to_f32(), 0, 0));
  EXPECT_TRUE(all_close(r[1].to_f32(), x.to_f32(), 0, 0));
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tag(in[0] * 2.0, "scaled")}; },
                 {{DType::f32, {2}}});
  EXPECT_NE(g->to_string().find("tag[name=\"scaled\"]"), std::string::npos) << g->to_string();
  EXPECT_EQ(g->nodes().back().name, "scaled");
}

// ---- gradients ------------------------------------------------------------------------------

TEST(ElementwiseGrad, Unary) {
  for (const UnaryCase& c : unary_cases()) {
    SCOPED_TRACE(c.name);
    // Away from poles (log, rsqrt near 0) where central differences lose accuracy.
    float lo = c.lo >= 0 ? std::max(c.lo, 0.5f) : std::max(c.lo, -3.0f);
    Array x = random_array({3, 5}, DType::f32, 17, lo, std::min(c.hi, 3.0f));
    if (std::string(c.name) == "abs") x = Array::from_f32({-2, -0.5f, 0.3f, 1.5f, -0.2f, 0.7f}, {2, 3});
    EXPECT_TRUE(check_grads([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0])}; }, {x}));
  }
}

TEST(ElementwiseGrad, BinaryWithBroadcasting) {
  for (const BinaryCase& c : binary_cases()) {
    SCOPED_TRACE(c.name);
    Array a = random_array({3, 1}, DType::f32, 5, c.lo, c.hi), b = random_array({1, 4}, DType::f32, 6, c.lo, c.hi);
    EXPECT_TRUE(check_grads(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0], in[1])}; }, {a, b}));
    Array s = random_array({}, DType::f32, 7, c.lo + 0.05f, c.hi), m = random_array({2, 3}, DType::f32, 8, c.lo, c.hi);
    EXPECT_TRUE(check_grads(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{c.op(in[0], in[1])}; }, {m, s}));
  }
}

TEST(ElementwiseGrad, MaximumTiesSplitTheGradient) {
  Array a = Array::from_f32({1, 2, 3}, {3}), b = Array::from_f32({1, 5, 0}, {3});
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        Tensor l = sum(maximum(in[0], in[1]));
        return gradients(l, {in[0], in[1]});
      },
      {a, b});
  EXPECT_TRUE(all_close(r[0].to_f32(), {0.5f, 0, 1}));
  EXPECT_TRUE(all_close(r[1].to_f32(), {0.5f, 1, 0}));
}

TEST(ElementwiseGrad, WhereCastTagAndStopGradient) {
  Array c = Array::from_f32({1, 0, 1, 0}, {4}, DType::boolean);
  Array a = random_array({4}, DType::f32, 1), b = random_array({}, DType::f32, 2);
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1] * in[1], exp(in[2]))}; },
      {c, a, b}, {1, 2}));
  EXPECT_TRUE(check_grads(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{tag(tanh(in[0]), "t") * 2.0}; }, {a}));
  // stop_gradient: d/dx (x * sg(x)) = sg(x); cast: the cotangent is cast back.
  Array x = random_array({5}, DType::f32, 3);
  auto r = eval(
      [](const std::vector<Tensor>& in) {
        Tensor l1 = sum(in[0] * stop_gradient(in[0]));
        Tensor l2 = sum(cast(in[0], DType::bf16) * cast(in[0] * 0.0 + 3.0, DType::bf16));
        return std::vector<Tensor>{gradients(l1, {in[0]})[0], gradients(l2, {in[0]})[0]};
      },
      {x});
  EXPECT_TRUE(all_close(r[0].to_f32(), x.to_f32()));
  EXPECT_EQ(r[1].dtype(), DType::f32);
  EXPECT_TRUE(all_close(r[1].to_f32(), std::vector<float>(5, 3.0f)));
}

TEST(ElementwiseGrad, IntegerAndBoolInputsGetNoGradient) {
  trace(
      [](const std::vector<Tensor>& in) {
        Tensor y = sum(in[0] * cast(in[1], DType::f32) + cast(greater(in[0], zeros_like(in[0])), DType::f32));
        std::vector<Tensor> d = gradients(y, {in[0], in[1]});
        EXPECT_TRUE(d[0].defined());
        EXPECT_FALSE(d[1].defined());
        return std::vector<Tensor>{d[0]};
      },
      {{DType::f32, {3}}, {DType::i32, {3}}});
}

// ---- errors ---------------------------------------------------------------------------------

TEST(ElementwiseErrors, DtypeMismatchSuggestsCast) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + in[1]}; },
                           {{DType::f32, {2, 3}}, {DType::bf16, {2, 3}}},
                           {"[add]", "f32[2,3]", "bf16[2,3]", "px::cast"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[2], in[0], in[1])}; },
                           {{DType::f32, {2}}, {DType::i32, {2}}, {DType::boolean, {2}}},
                           {"[where]", "f32[2]", "i32[2]", "px::cast"}));
}

TEST(ElementwiseErrors, BadBroadcastNamesBothShapes) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * in[1]}; },
                           {{DType::f32, {2, 3}}, {DType::f32, {4}}}, {"[mul]", "f32[2,3]", "f32[4]", "3 vs 4"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{broadcast_to(in[0], {3, 4})}; },
      {{DType::f32, {2, 4}}}, {"[broadcast_to]", "f32[2,4]", "[3,4]"}));
}

TEST(ElementwiseErrors, BadSelectCondition) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[1])}; },
                           {{DType::f32, {2}}, {DType::f32, {2}}}, {"[where]", "condition must be bool", "f32[2]"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1("select", {in[0], in[1], in[1]})}; },
      {{DType::i32, {2}}, {DType::f32, {2}}}, {"[select]", "must be bool"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{where(in[0], in[1], in[1])}; },
      {{DType::boolean, {3}}, {DType::f32, {2}}}, {"[where]", "bool[3]", "f32[2]"}));
}

TEST(ElementwiseErrors, WrongDtypeFamilies) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0])}; },
                           {{DType::i32, {2}}}, {"[exp]", "floating-point", "i32[2]", "px::cast"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{logical_and(in[0], in[0])}; },
                           {{DType::f32, {2}}}, {"[logical_and]", "bool", "f32[2]"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] + in[0]}; },
                           {{DType::boolean, {2}}}, {"[add]", "bool[2]"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0] * 0.5}; },
                           {{DType::i32, {2}}}, {"[mul]", "0.5", "i32[2]"}));
}

TEST(ElementwiseErrors, PrimitivesDoNotBroadcast) {
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1("add", {in[0], in[1]})}; },
                           {{DType::f32, {2, 3}}, {DType::f32, {3}}}, {"[add]", "shapes differ", "f32[2,3]", "f32[3]"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add(in[0], Tensor())}; },
                           {{DType::f32, {2}}}, {"[add]", "undefined"}));
}

// ---- rules ----------------------------------------------------------------------------------

TEST(ElementwiseRules, ShardingAndCost) {
  const Primitive& add_p = get_primitive("add");
  TensorType t{DType::f32, {4, 8}};
  EXPECT_EQ(sharding_of(add_p, {t, t}, {t}, {}).to_string(), "ab,ab->ab");
  EXPECT_TRUE(add_p.elementwise);
  Cost c = cost_of(get_primitive("exp"), {t}, {t}, {});
  EXPECT_EQ(c.bytes_read, 128);
  EXPECT_EQ(c.bytes_written, 128);
  EXPECT_GT(c.flops, 32);
  EXPECT_EQ(get_primitive("lt").vjp, nullptr);
}

}  // namespace
}  // namespace px
