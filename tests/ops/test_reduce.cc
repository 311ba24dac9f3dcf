// Reductions: sum, max, mean (and the reduce_sum / reduce_max primitives under them).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "ir/primitive.h"
#include "parallax/autodiff.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval1;
using testing::random_array;
using testing::throws_error;
using Ints = std::vector<int64_t>;
using V = std::vector<Tensor>;

// Straightforward reference in f64: out[kept index] = fold over the reduced indices.
std::vector<double> ref_reduce(const std::vector<float>& x, const Shape& s, Ints axes, bool is_max) {
  if (axes.empty())
    for (size_t d = 0; d < s.size(); ++d) axes.push_back(static_cast<int64_t>(d));
  for (auto& a : axes)
    if (a < 0) a += static_cast<int64_t>(s.size());
  Shape os;
  for (size_t d = 0; d < s.size(); ++d)
    if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) == axes.end()) os.push_back(s[d]);
  std::vector<double> out(static_cast<size_t>(numel(os)), is_max ? -INFINITY : 0.0);
  Ints idx(s.size(), 0);
  for (size_t flat = 0; flat < x.size(); ++flat) {
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (std::find(axes.begin(), axes.end(), static_cast<int64_t>(d)) == axes.end()) o = o * s[d] + idx[d];
    out[o] = is_max ? std::max<double>(out[o], x[flat]) : out[o] + x[flat];
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

std::vector<float> to_float(const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); }

struct Case {
  Shape shape;
  Ints axes;
};

const std::vector<Case> kCases = {
    {{7}, {0}},
    {{5, 9}, {1}},
    {{5, 9}, {0}},
    {{5, 9}, {}},
    {{3, 4, 5}, {1}},
    {{3, 4, 5}, {0, 2}},
    {{3, 4, 5}, {-1, -3}},
    {{2, 3, 4, 5}, {1, 3}},
    {{2, 1, 6}, {1}},          // only a size-1 dim: a copy
    {{4, 1, 6}, {0, 1}},
    {{1, 300, 1, 7}, {1}},
    {{33, 1027}, {1}},         // rows longer than one block
    {{1027, 33}, {0}},         // column sums with a ragged tail
    {{3, 600, 300}, {1}},      // middle axis, more than one column block
};

TEST(Sum, MatchesReferenceOnManyShapes) {
  for (auto& c : kCases) {
    Array x = random_array(c.shape, DType::f32, 11);
    Ints axes = c.axes;
    Array y = eval1([&](const V& in) { return V{sum(in[0], axes)}; }, {x});
    EXPECT_TRUE(all_close(y.to_f32(), to_float(ref_reduce(x.to_f32(), c.shape, axes, false)), 1e-4, 1e-5))
        << shape_str(c.shape) << " axes " << shape_str(axes);
  }
}

TEST(Max, MatchesReferenceOnManyShapes) {
  for (auto& c : kCases) {
    Array x = random_array(c.shape, DType::f32, 12);
    Ints axes = c.axes;
    Array y = eval1([&](const V& in) { return V{max(in[0], axes)}; }, {x});
    EXPECT_EQ(y.to_f32(), to_float(ref_reduce(x.to_f32(), c.shape, axes, true)))
        << shape_str(c.shape) << " axes " << shape_str(axes);
  }
}

TEST(Mean, KeepdimsAndNegativeAxes) {
  Array x = random_array({4, 3, 5});
  Array y = eval1([](const V& in) { return V{mean(in[0], {-1, 0}, true)}; }, {x});
  EXPECT_EQ(y.shape(), (Shape{1, 3, 1}));
  std::vector<double> s = ref_reduce(x.to_f32(), {4, 3, 5}, {0, 2}, false);
  for (auto& v : s) v /= 20;
  EXPECT_TRUE(all_close(y.to_f32(), to_float(s), 1e-6, 1e-5));
  Array all = eval1([](const V& in) { return V{mean(in[0])}; }, {x});
  EXPECT_EQ(all.shape(), Shape{});
  Array k = eval1([](const V& in) { return V{sum(in[0], {}, true)}; }, {x});
  EXPECT_EQ(k.shape(), (Shape{1, 1, 1}));
  Array m = eval1([](const V& in) { return V{max(in[0], {1}, true)}; }, {x});
  EXPECT_EQ(m.shape(), (Shape{4, 1, 5}));
}

TEST(Reduce, RankZeroAndEmptyDims) {
  Array s = Array::scalar(2.5f);
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0])}; }, {s}).to_f32(), (std::vector<float>{2.5f}));
  EXPECT_EQ(eval1([](const V& in) { return V{max(in[0], {}, true)}; }, {s}).to_f32(), (std::vector<float>{2.5f}));
  Array e = random_array({3, 0});
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0], {1})}; }, {e}).to_f32(), (std::vector<float>{0, 0, 0}));
  std::vector<float> mx = eval1([](const V& in) { return V{max(in[0], {1})}; }, {e}).to_f32();
  ASSERT_EQ(mx.size(), 3u);
  EXPECT_TRUE(std::isinf(mx[0]) && mx[0] < 0);
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0], {0})}; }, {e}).shape(), (Shape{0}));
  EXPECT_TRUE(std::isnan(eval1([](const V& in) { return V{mean(in[0])}; }, {e}).to_f32()[0]));
  Array ie = Array::from_i32({}, {0});
  EXPECT_EQ(eval1([](const V& in) { return V{max(in[0])}; }, {ie}).to_i32()[0], std::numeric_limits<int32_t>::min());
}

TEST(Reduce, TransposedInputs) {
  Array x = random_array({6, 5, 7});
  Array y = eval1([](const V& in) { return V{sum(transpose(in[0], {2, 0, 1}), {0, 2})}; }, {x});
  EXPECT_TRUE(all_close(y.to_f32(), to_float(ref_reduce(x.to_f32(), {6, 5, 7}, {1, 2}, false)), 1e-5, 1e-5));
  Array z = eval1([](const V& in) { return V{max(transpose(in[0], {1, 0, 2}), {1})}; }, {x});
  // max over the original axis 0 leaves [5, 7].
  EXPECT_EQ(z.to_f32(), to_float(ref_reduce(x.to_f32(), {6, 5, 7}, {0}, true)));
}

TEST(Reduce, Bf16AccumulatesInF32) {
  // 4096 ones sum to 4096 exactly; a bf16 accumulator would stall at 256.
  Array ones = Array::from_f32(std::vector<float>(4096, 1.0f), {4096}, DType::bf16);
  Array y = eval1([](const V& in) { return V{sum(in[0])}; }, {ones});
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_f32()[0], 4096.0f);
  Array col = Array::from_f32(std::vector<float>(4096 * 3, 1.0f), {4096, 3}, DType::bf16);
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0], {0})}; }, {col}).to_f32(),
            (std::vector<float>{4096, 4096, 4096}));
  for (DType d : {DType::bf16, DType::f16}) {
    Array x = random_array({9, 70}, d, 4);
    for (Ints axes : {Ints{1}, Ints{0}}) {
      std::vector<double> want = ref_reduce(x.to_f32(), {9, 70}, axes, false);
      Array got = eval1([&](const V& in) { return V{sum(in[0], axes)}; }, {x});
      // One rounding of the exact sum to 16 bits.
      EXPECT_TRUE(all_close(got.to_f32(), to_float(want), 1e-2, d == DType::bf16 ? 8e-3 : 1e-3)) << dtype_name(d);
      Array mx = eval1([&](const V& in) { return V{max(in[0], axes)}; }, {x});
      EXPECT_EQ(mx.to_f32(), to_float(ref_reduce(x.to_f32(), {9, 70}, axes, true)));
    }
  }
}

TEST(Reduce, I32SumIsExact) {
  // 2^24 + 3 is not representable in f32; an i32 sum must still be exact.
  Array x = Array::from_i32({1 << 24, 1, 1, 1, -5, 5}, {2, 3});
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0])}; }, {x}).to_i32(), (std::vector<int32_t>{(1 << 24) + 3}));
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0], {0})}; }, {x}).to_i32(),
            (std::vector<int32_t>{(1 << 24) + 1, -4, 6}));
  EXPECT_EQ(eval1([](const V& in) { return V{max(in[0], {1})}; }, {x}).to_i32(), (std::vector<int32_t>{1 << 24, 5}));
  EXPECT_EQ(eval1([](const V& in) { return V{sum(in[0], {1})}; }, {x}).dtype(), DType::i32);
}

TEST(Reduce, LargeF32SumsStayAccurate) {
  // 2^22 values of 0.1 (row reduction split into chunks) and a 200000-row column sum.
  const int64_t n = 1 << 22;
  Array x = Array::from_f32(std::vector<float>(n, 0.1f), {n});
  double exact = static_cast<double>(0.1f) * n;
  float got = eval1([](const V& in) { return V{sum(in[0])}; }, {x}).to_f32()[0];
  EXPECT_NEAR(got, exact, exact * 1e-6);
  Array c = Array::from_f32(std::vector<float>(200000 * 3, 0.1f), {200000, 3});
  double exact_c = static_cast<double>(0.1f) * 200000;
  for (float v : eval1([](const V& in) { return V{sum(in[0], {0})}; }, {c}).to_f32())
    EXPECT_NEAR(v, exact_c, exact_c * 1e-6);
  // Few outputs with long rows, and a middle-axis reduction with few outputs.
  Array r = random_array({2, 100003}, DType::f32, 8);
  EXPECT_TRUE(all_close(eval1([](const V& in) { return V{sum(in[0], {1})}; }, {r}).to_f32(),
                        to_float(ref_reduce(r.to_f32(), {2, 100003}, {1}, false)), 1e-4, 1e-5));
  Array m = random_array({2, 40001, 3}, DType::f32, 9);
  EXPECT_TRUE(all_close(eval1([](const V& in) { return V{sum(in[0], {1})}; }, {m}).to_f32(),
                        to_float(ref_reduce(m.to_f32(), {2, 40001, 3}, {1}, false)), 1e-4, 1e-5));
  EXPECT_EQ(eval1([](const V& in) { return V{max(in[0], {1})}; }, {m}).to_f32(),
            to_float(ref_reduce(m.to_f32(), {2, 40001, 3}, {1}, true)));
}

TEST(Reduce, SameBitsWhateverTheThreadCount) {
  Array x = random_array({3, 70001}, DType::f32, 21);
  Array c = random_array({50001, 5}, DType::f32, 22);
  auto run = [&] {
    return std::make_pair(eval1([](const V& in) { return V{sum(in[0], {1})}; }, {x}).to_f32(),
                          eval1([](const V& in) { return V{sum(in[0], {0})}; }, {c}).to_f32());
  };
  auto many = run();
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  auto one = run();
  omp_set_num_threads(saved);
  EXPECT_EQ(many.first, one.first);
  EXPECT_EQ(many.second, one.second);
}

TEST(Reduce, MaxPropagatesNaN) {
  Array x = Array::from_f32({1, NAN, 3, 4, 5, 6}, {2, 3});
  std::vector<float> rows = eval1([](const V& in) { return V{max(in[0], {1})}; }, {x}).to_f32();
  EXPECT_TRUE(std::isnan(rows[0]));
  EXPECT_EQ(rows[1], 6.0f);
  std::vector<float> cols = eval1([](const V& in) { return V{max(in[0], {0})}; }, {x}).to_f32();
  EXPECT_EQ(cols[0], 4.0f);
  EXPECT_TRUE(std::isnan(cols[1]));
}

TEST(Reduce, Gradients) {
  Array x = random_array({3, 4, 5});
  EXPECT_TRUE(check_grads([](const V& in) { return V{sum(in[0], {1})}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{sum(in[0] * in[0], {0, 2}, true)}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{mean(in[0], {-1})}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{mean(in[0])}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{max(in[0], {1})}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{max(in[0], {0, 2}, true)}; }, {x}));
}

TEST(Reduce, MaxGradientSplitsTiesEvenly) {
  Array x = Array::from_f32({1, 3, 3, 2, 5, 0, 0, 5, 5}, {3, 3});
  auto g = trace(
      [](const V& in) {
        Tensor y = sum(max(in[0], {1}));
        return gradients(y, {in[0]});
      },
      {x.type()});
  Array d = Executable::compile(*g)->run({x})[0];
  EXPECT_TRUE(all_close(d.to_f32(), {0, 0.5f, 0.5f, 0, 1, 0, 0, 0.5f, 0.5f}));
}

TEST(Reduce, BadInputIsAnError) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{sum(in[0], {2})}; }, {{DType::f32, {3, 4}}},
                           {"[sum]", "axis 2", "f32[3,4]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{max(in[0], {-3})}; }, {{DType::f32, {3, 4}}},
                           {"[max]", "axis -3"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{sum(in[0], {1, -1})}; }, {{DType::f32, {3, 4}}},
                           {"[sum]", "twice"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{sum(in[0])}; }, {{DType::boolean, {3}}},
                           {"[reduce_sum]", "bool"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{mean(in[0])}; }, {{DType::i32, {3}}}, {"[mean]", "i32[3]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{emit1("reduce_sum", {in[0]}, Attrs{{"axes", Ints{1, 0}}})}; },
                           {{DType::f32, {3, 4}}}, {"[reduce_sum]", "sorted"}));
  auto sum_as = [](DType out) {
    return [out](const V& in) { return V{emit1("reduce_sum", {in[0]}, Attrs{{"axes", Ints{0}}, {"out_dtype", out}})}; };
  };
  EXPECT_TRUE(throws_error(sum_as(DType::i32), {{DType::bf16, {3, 4}}}, {"[reduce_sum]", "out_dtype", "i32"}));
  EXPECT_TRUE(throws_error(sum_as(DType::f32), {{DType::i32, {3, 4}}}, {"[reduce_sum]", "float operand", "i32[3,4]"}));
}

// A sum of 16-bit values written in f32 (what compile makes of a bias gradient under bf16): the
// sum of the widened values, as when the operand is cast first, and its gradient in the operand's type.
TEST(Reduce, SumOfSixteenBitValuesWrittenInF32) {
  Array x = random_array({6, 300}, DType::bf16, 3);
  auto g = trace(
      [](const V& in) {
        Tensor direct = emit1("reduce_sum", {in[0]}, Attrs{{"axes", Ints{0}}, {"out_dtype", DType::f32}});
        Tensor rows = emit1("reduce_sum", {in[0]}, Attrs{{"axes", Ints{1}}, {"out_dtype", DType::f32}});
        Tensor grad = gradients(sum(rows), {in[0]})[0];
        return V{direct, sum(cast(in[0], DType::f32), {0}), grad};
      },
      {x.type()});
  std::vector<Array> r = Executable::compile(*g)->run({x});
  EXPECT_EQ(r[0].type(), (TensorType{DType::f32, {300}}));
  EXPECT_EQ(r[0].to_f32(), r[1].to_f32());
  EXPECT_EQ(r[2].type(), x.type());
  EXPECT_EQ(r[2].to_f32(), std::vector<float>(1800, 1.0f));
}

TEST(Reduce, ShardingRuleMarksReducedDims) {
  auto g = trace([](const V& in) { return V{sum(in[0], {1})}; }, {{DType::f32, {4, 5, 6}}});
  const Node& n = g->nodes().back();
  ShardingRule r = sharding_of(*n.prim, {g->type(n.inputs[0])}, {g->type(n.outputs[0])}, n.attrs);
  EXPECT_EQ(r.to_string(), "abc->ac {b: reduction}");
  Cost c = cost_of(*n.prim, {g->type(n.inputs[0])}, {g->type(n.outputs[0])}, n.attrs);
  EXPECT_EQ(c.flops, 120);
  EXPECT_EQ(c.bytes_written, 4 * 24);
}

}  // namespace
}  // namespace px
