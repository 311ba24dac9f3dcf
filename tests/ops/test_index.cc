// Indexing primitives: take (embedding lookup), scatter_add (its gradient) and one_hot.
#include <omp.h>

#include <algorithm>

#include "ir/primitive.h"
#include "testing.h"

namespace px {
namespace {

using testing::all_close;
using testing::check_grads;
using testing::eval1;
using testing::random_array;
using testing::throws_error;
using V = std::vector<Tensor>;

int64_t clamp(int64_t i, int64_t n) { return std::min(std::max<int64_t>(i, 0), n - 1); }

std::vector<float> ref_take(const Array& table, const std::vector<int32_t>& idx) {
  std::vector<float> t = table.to_f32(), out;
  int64_t rows = table.shape()[0], d = table.numel() / rows;
  for (int32_t i : idx) {
    int64_t r = clamp(i, rows);
    out.insert(out.end(), t.begin() + r * d, t.begin() + (r + 1) * d);
  }
  return out;
}

std::vector<float> ref_scatter(const std::vector<int32_t>& idx, const Array& upd, int64_t rows) {
  std::vector<float> u = upd.to_f32();
  int64_t d = idx.empty() ? 0 : upd.numel() / static_cast<int64_t>(idx.size());
  std::vector<double> acc(static_cast<size_t>(rows * d), 0.0);
  for (size_t k = 0; k < idx.size(); ++k)
    for (int64_t c = 0; c < d; ++c) acc[clamp(idx[k], rows) * d + c] += u[k * d + c];
  return std::vector<float>(acc.begin(), acc.end());
}

std::vector<int32_t> random_indices(size_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> u(lo, hi);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// ---- take ---------------------------------------------------------------------------------------

TEST(Take, GathersRowsForAnyIndexShape) {
  Array table = random_array({7, 3});
  std::vector<int32_t> idx = {6, 0, 3, 3, 1, 2, 5, 4};
  Array y = eval1([](const V& in) { return V{take(in[0], in[1])}; }, {table, Array::from_i32(idx, {2, 4})});
  EXPECT_EQ(y.shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(y.to_f32(), ref_take(table, idx));
  // 1-D table: a plain gather of scalars; rank-0 index; 3-D table rows.
  Array t1 = random_array({5});
  EXPECT_EQ(eval1([](const V& in) { return V{take(in[0], in[1])}; }, {t1, Array::from_i32({4, 0}, {2})}).to_f32(),
            ref_take(t1, {4, 0}));
  Array t3 = random_array({4, 2, 3});
  Array s = eval1([](const V& in) { return V{take(in[0], in[1])}; }, {t3, Array::from_i32({2}, {})});
  EXPECT_EQ(s.shape(), (Shape{2, 3}));
  EXPECT_EQ(s.to_f32(), ref_take(t3, {2}));
}

TEST(Take, ClampsOutOfRangeIndices) {
  Array table = random_array({4, 2});
  std::vector<int32_t> idx = {-1, 4, 100, -100000, 2};
  Array y = eval1([](const V& in) { return V{take(in[0], in[1])}; }, {table, Array::from_i32(idx, {5})});
  EXPECT_EQ(y.to_f32(), ref_take(table, idx));
  std::vector<float> t = table.to_f32();
  EXPECT_EQ(y.to_f32()[0], t[0]);  // -1 -> row 0
  EXPECT_EQ(y.to_f32()[2], t[6]);  // 4 -> row 3
}

TEST(Take, Bf16I32EmptyAndLarge) {
  Array tb = random_array({9, 5}, DType::bf16);
  std::vector<int32_t> idx = random_indices(11, 0, 8, 3);
  Array y = eval1([](const V& in) { return V{take(in[0], in[1])}; }, {tb, Array::from_i32(idx, {11})});
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_f32(), ref_take(tb, idx));
  Array ti = Array::from_i32({10, 20, 30}, {3});
  EXPECT_EQ(eval1([](const V& in) { return V{take(in[0], in[1])}; }, {ti, Array::from_i32({2, 2, 0}, {3})}).to_i32(),
            (std::vector<int32_t>{30, 30, 10}));
  Array e = eval1([](const V& in) { return V{take(in[0], in[1])}; }, {tb, Array::from_i32({}, {0, 2})});
  EXPECT_EQ(e.shape(), (Shape{0, 2, 5}));
  Array big = random_array({1000, 257});
  std::vector<int32_t> bidx = random_indices(2000, 0, 999, 4);
  EXPECT_EQ(eval1([](const V& in) { return V{take(in[0], in[1])}; }, {big, Array::from_i32(bidx, {2000})}).to_f32(),
            ref_take(big, bidx));
}

TEST(Take, GradientIsScatterAdd) {
  Array table = random_array({5, 3});
  Array idx = Array::from_i32({1, 4, 1, 0, 1, 7}, {2, 3});  // repeats and one clamped index
  EXPECT_TRUE(check_grads([](const V& in) { return V{take(in[0], in[1])}; }, {table, idx}));
  auto g = trace([](const V& in) { return gradients(sum(take(in[0], in[1])), {in[0]}); },
                 {table.type(), idx.type()});
  std::vector<Array> d = Executable::compile(*g)->run({table, idx});
  EXPECT_EQ(d[0].to_f32(), (std::vector<float>{1, 1, 1, 3, 3, 3, 0, 0, 0, 0, 0, 0, 2, 2, 2}));
}

TEST(Take, BadInputIsAnError) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{take(in[0], in[1])}; },
                           {{DType::f32, {5, 3}}, {DType::f32, {4}}}, {"[take]", "indices must be i32", "f32[4]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{take(in[0], in[1])}; }, {{DType::f32, {}}, {DType::i32, {4}}},
                           {"[take]", "rank >= 1"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{take(in[0], in[1])}; },
                           {{DType::f32, {0, 3}}, {DType::i32, {4}}}, {"[take]", "no rows"}));
}

TEST(Take, ShardingRule) {
  auto g = trace([](const V& in) { return V{take(in[0], in[1])}; }, {{DType::f32, {10, 4}}, {DType::i32, {2, 3}}});
  const Node& n = g->nodes().back();
  ShardingRule r = sharding_of(*n.prim, {g->type(n.inputs[0]), g->type(n.inputs[1])}, {g->type(n.outputs[0])}, n.attrs);
  EXPECT_EQ(r.to_string(), "ad,bc->bcd {a: whole}");
}

// ---- scatter_add --------------------------------------------------------------------------------

TEST(ScatterAdd, SumsDuplicatesAndClamps) {
  std::vector<int32_t> idx = {2, 0, 2, 5, -3, 2};
  Array upd = random_array({2, 3, 4});
  Array y = eval1([](const V& in) { return V{scatter_add(in[0], in[1], 6)}; }, {Array::from_i32(idx, {2, 3}), upd});
  EXPECT_EQ(y.shape(), (Shape{6, 4}));
  EXPECT_TRUE(all_close(y.to_f32(), ref_scatter(idx, upd, 6)));
  // Rows nobody writes are zero; scalar rows; an index past the end goes to the last row.
  Array y1 = eval1([](const V& in) { return V{scatter_add(in[0], in[1], 4)}; },
                   {Array::from_i32({1, 9, 1}, {3}), Array::from_f32({1, 2, 3}, {3})});
  EXPECT_EQ(y1.to_f32(), (std::vector<float>{0, 4, 0, 2}));
}

TEST(ScatterAdd, Bf16I32EmptyAndWideRows) {
  std::vector<int32_t> idx = random_indices(300, 0, 9, 5);
  Array ub = random_array({300, 6}, DType::bf16);
  Array yb = eval1([](const V& in) { return V{scatter_add(in[0], in[1], 10)}; }, {Array::from_i32(idx, {300}), ub});
  EXPECT_EQ(yb.dtype(), DType::bf16);
  // f32 accumulation, one rounding to bf16 at the end.
  EXPECT_TRUE(all_close(yb.to_f32(), ref_scatter(idx, ub, 10), 2e-2, 8e-3));
  Array ui = Array::from_i32({1, 2, 3, 4}, {2, 2});
  EXPECT_EQ(eval1([](const V& in) { return V{scatter_add(in[0], in[1], 2)}; }, {Array::from_i32({1, 1}, {2}), ui})
                .to_i32(),
            (std::vector<int32_t>{0, 0, 4, 6}));
  Array e = eval1([](const V& in) { return V{scatter_add(in[0], in[1], 3)}; },
                  {Array::from_i32({}, {0}), random_array({0, 2})});
  EXPECT_EQ(e.to_f32(), std::vector<float>(6, 0.0f));
  std::vector<int32_t> widx = random_indices(40, 0, 2, 6);
  Array wide = random_array({40, 2500});  // several column blocks per row
  EXPECT_TRUE(all_close(eval1([](const V& in) { return V{scatter_add(in[0], in[1], 3)}; },
                              {Array::from_i32(widx, {40}), wide})
                            .to_f32(),
                        ref_scatter(widx, wide, 3), 1e-4, 1e-5));
}

TEST(ScatterAdd, DeterministicWhateverTheThreadCount) {
  std::vector<int32_t> idx = random_indices(4096, 0, 31, 7);  // heavy collisions
  Array upd = random_array({4096, 64}, DType::f32, 8);
  Array id = Array::from_i32(idx, {4096});
  auto run = [&] { return eval1([](const V& in) { return V{scatter_add(in[0], in[1], 32)}; }, {id, upd}).to_f32(); };
  std::vector<float> a = run(), b = run();
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  std::vector<float> c = run();
  omp_set_num_threads(saved);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a, c);
  EXPECT_TRUE(all_close(a, ref_scatter(idx, upd, 32), 1e-4, 1e-5));
}

TEST(ScatterAdd, GradientIsTake) {
  Array idx = Array::from_i32({3, 0, 3, 1}, {4});
  EXPECT_TRUE(check_grads([](const V& in) { return V{scatter_add(in[0], in[1], 5)}; }, {idx, random_array({4, 3})}));
}

TEST(ScatterAdd, BadInputIsAnError) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{scatter_add(in[0], in[1], 4)}; },
                           {{DType::f32, {3}}, {DType::f32, {3, 2}}}, {"[scatter_add]", "indices must be i32"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{scatter_add(in[0], in[1], 4)}; },
                           {{DType::i32, {3}}, {DType::f32, {2, 2}}}, {"[scatter_add]", "f32[2,2]", "[3]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{scatter_add(in[0], in[1], -1)}; },
                           {{DType::i32, {3}}, {DType::f32, {3}}}, {"[scatter_add]", "num_rows -1"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{scatter_add(in[0], in[1], 0)}; },
                           {{DType::i32, {3}}, {DType::f32, {3}}}, {"[scatter_add]", "num_rows is 0"}));
}

TEST(ScatterAdd, ShardingRuleLeavesPartialSums) {
  auto g = trace([](const V& in) { return V{scatter_add(in[0], in[1], 10)}; },
                 {{DType::i32, {2, 3}}, {DType::f32, {2, 3, 4}}});
  const Node& n = g->nodes().back();
  ShardingRule r = sharding_of(*n.prim, {g->type(n.inputs[0]), g->type(n.inputs[1])}, {g->type(n.outputs[0])}, n.attrs);
  EXPECT_EQ(r.to_string(), "bc,bcd->ad {a: whole, b: reduction, c: reduction}");
}

// ---- one_hot ------------------------------------------------------------------------------------

TEST(OneHot, ValuesDtypesAndOutOfRange) {
  Array idx = Array::from_i32({2, 0, -1, 3, 1, 7}, {2, 3});
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    Array y = eval1([d](const V& in) { return V{one_hot(in[0], 4, d)}; }, {idx});
    EXPECT_EQ(y.dtype(), d);
    EXPECT_EQ(y.shape(), (Shape{2, 3, 4}));
    std::vector<float> want(24, 0.0f);
    want[0 * 4 + 2] = want[1 * 4 + 0] = want[3 * 4 + 3] = want[4 * 4 + 1] = 1.0f;
    EXPECT_EQ(y.to_f32(), want) << dtype_name(d);
  }
  EXPECT_EQ(eval1([](const V& in) { return V{one_hot(in[0], 3)}; }, {Array::from_i32({1}, {})}).to_f32(),
            (std::vector<float>{0, 1, 0}));
  EXPECT_EQ(eval1([](const V& in) { return V{one_hot(in[0], 0)}; }, {idx}).shape(), (Shape{2, 3, 0}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{one_hot(in[0], -2)}; }, {{DType::i32, {3}}},
                           {"[one_hot]", "depth -2"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{one_hot(in[0], 4)}; }, {{DType::bf16, {3}}},
                           {"[one_hot]", "indices must be i32", "bf16[3]"}));
}

TEST(OneHot, FeedsDifferentiableCode) {
  // one_hot of labels times logits: gradients flow to the logits, never to the labels.
  Array logits = random_array({3, 5});
  Array labels = Array::from_i32({4, 0, 2}, {3});
  EXPECT_TRUE(check_grads([](const V& in) { return V{sum(one_hot(in[1], 5) * in[0], {1})}; }, {logits, labels}));
}

}  // namespace
}  // namespace px
