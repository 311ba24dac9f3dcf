// Shape primitives: reshape, transpose, slice, concat, pad and the ops built on them.
#include <numeric>

#include "ir/primitive.h"
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

// ---- references ---------------------------------------------------------------------------------

Ints strides_of(const Shape& s) {
  Ints st(s.size(), 1);
  for (int d = static_cast<int>(s.size()) - 2; d >= 0; --d) st[d] = st[d + 1] * s[d + 1];
  return st;
}

// Calls f(multi-index, flat index) for every element of shape s in row-major order.
template <class F>
void for_each_index(const Shape& s, F f) {
  int64_t n = numel(s);
  Ints idx(s.size(), 0);
  for (int64_t flat = 0; flat < n; ++flat) {
    f(idx, flat);
    for (int d = static_cast<int>(s.size()) - 1; d >= 0; --d) {
      if (++idx[d] < s[d]) break;
      idx[d] = 0;
    }
  }
}

std::vector<float> ref_transpose(const std::vector<float>& x, const Shape& s, const Ints& perm) {
  Shape os;
  for (int64_t p : perm) os.push_back(s[p]);
  Ints st = strides_of(s);
  std::vector<float> out(x.size());
  for_each_index(os, [&](const Ints& idx, int64_t flat) {
    int64_t src = 0;
    for (size_t i = 0; i < perm.size(); ++i) src += idx[i] * st[perm[i]];
    out[flat] = x[src];
  });
  return out;
}

std::vector<float> ref_slice(const std::vector<float>& x, const Shape& s, const Ints& starts, const Shape& os,
                             const Ints& strides) {
  Ints st = strides_of(s);
  std::vector<float> out(static_cast<size_t>(numel(os)));
  for_each_index(os, [&](const Ints& idx, int64_t flat) {
    int64_t src = 0;
    for (size_t d = 0; d < s.size(); ++d) src += (starts[d] + idx[d] * strides[d]) * st[d];
    out[flat] = x[src];
  });
  return out;
}

std::vector<float> ref_pad(const std::vector<float>& x, const Shape& s, const Ints& lo, const Ints& hi,
                           const Ints& interior, float value, Shape* out_shape) {
  Shape os;
  for (size_t d = 0; d < s.size(); ++d)
    os.push_back(lo[d] + hi[d] + s[d] + std::max<int64_t>(s[d] - 1, 0) * interior[d]);
  *out_shape = os;
  std::vector<float> out(static_cast<size_t>(numel(os)), value);
  Ints ost = strides_of(os);
  for_each_index(s, [&](const Ints& idx, int64_t flat) {
    int64_t dst = 0;
    for (size_t d = 0; d < s.size(); ++d) dst += (lo[d] + idx[d] * (interior[d] + 1)) * ost[d];
    out[dst] = x[flat];
  });
  return out;
}

Tensor emit_pad(const Tensor& x, const Ints& lo, const Ints& hi, const Ints& interior, double value) {
  return emit1("pad", {x}, Attrs{{"lo", lo}, {"hi", hi}, {"interior", interior}, {"value", value}});
}

ShardingRule rule_of(const TracedFn& fn, const std::vector<TensorType>& types) {
  auto g = trace(fn, types);
  const Node& n = g->nodes().back();
  std::vector<TensorType> in, out;
  for (int v : n.inputs) in.push_back(g->type(v));
  for (int v : n.outputs) out.push_back(g->type(v));
  return sharding_of(*n.prim, in, out, n.attrs);
}

// ---- reshape ------------------------------------------------------------------------------------

TEST(Reshape, KeepsRowMajorOrderAndResolvesMinusOne) {
  Array x = random_array({2, 3, 4});
  Array y = eval1([](const V& in) { return V{reshape(in[0], {4, -1})}; }, {x});
  EXPECT_EQ(y.shape(), (Shape{4, 6}));
  EXPECT_EQ(y.to_f32(), x.to_f32());
  Array z = eval1([](const V& in) { return V{reshape(in[0], {-1})}; }, {x});
  EXPECT_EQ(z.shape(), (Shape{24}));
  // Rank 0 <-> rank 1 and empty arrays.
  Array s = Array::scalar(3.5f);
  EXPECT_EQ(eval1([](const V& in) { return V{reshape(in[0], {1, 1})}; }, {s}).to_f32(), (std::vector<float>{3.5f}));
  Array e = random_array({0, 5});
  EXPECT_EQ(eval1([](const V& in) { return V{reshape(in[0], {5, 0, 3})}; }, {e}).shape(), (Shape{5, 0, 3}));
}

TEST(Reshape, WorksOnBf16AndLargeArrays) {
  Array x = random_array({3, 7}, DType::bf16);
  Array y = eval1([](const V& in) { return V{reshape(in[0], {7, 3})}; }, {x});
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_f32(), x.to_f32());
  Array big = random_array({512, 1031});  // parallel copy path
  EXPECT_EQ(eval1([](const V& in) { return V{reshape(in[0], {1031, 512})}; }, {big}).to_f32(), big.to_f32());
}

TEST(Reshape, ErrorsNameBothShapes) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{reshape(in[0], {4, 2})}; }, {{DType::f32, {2, 3}}},
                           {"[reshape]", "f32[2,3]", "[4,2]", "6 elements", "8 elements"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{reshape(in[0], {-1, -1})}; }, {{DType::f32, {2, 3}}},
                           {"[reshape]", "more than one -1"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{reshape(in[0], {4, -1})}; }, {{DType::f32, {2, 3}}},
                           {"[reshape]", "f32[2,3]", "[4,-1]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{reshape(in[0], {-2, 3})}; }, {{DType::f32, {2, 3}}},
                           {"[reshape]", "negative"}));
}

TEST(Reshape, Gradient) {
  EXPECT_TRUE(check_grads([](const V& in) { return V{reshape(in[0], {3, 2, 2}) * 2.0}; }, {random_array({4, 3})}));
}

TEST(Reshape, ShardingRuleSharesMajorDimsOfEachGroup) {
  // [4,6,8] -> [24,8]: splitting the 4 in blocks splits the 24 alike; the 6 stays whole.
  ShardingRule r = rule_of([](const V& in) { return V{reshape(in[0], {24, 8})}; }, {{DType::f32, {4, 6, 8}}});
  EXPECT_EQ(r.to_string(), "abc->ac {b: whole}");
  EXPECT_EQ(r.factor_sizes[0], 4);
  // Heads: [S, H*Dh] -> [S, H, Dh] keeps H shardable.
  ShardingRule h = rule_of([](const V& in) { return V{reshape(in[0], {5, 8, 16})}; }, {{DType::f32, {5, 128}}});
  EXPECT_EQ(h.to_string(), "ab->abc {c: whole}");
  EXPECT_EQ(h.factor_sizes[1], 8);
  // [6,4] -> [4,6]: only block counts dividing both 6 and 4 line up.
  ShardingRule g = rule_of([](const V& in) { return V{reshape(in[0], {4, 6})}; }, {{DType::f32, {6, 4}}});
  EXPECT_EQ(g.to_string(), "ab->ac {b: whole, c: whole}");
  EXPECT_EQ(g.factor_sizes[0], 2);
  ShardingRule s = rule_of([](const V& in) { return V{reshape(in[0], {4, 1, 6})}; }, {{DType::f32, {4, 6}}});
  EXPECT_EQ(s.to_string(), "ab->a1b");
}

// ---- transpose ----------------------------------------------------------------------------------

struct PermCase {
  Shape shape;
  Ints perm;
};

TEST(Transpose, MatchesReferenceOnManyLayouts) {
  std::vector<PermCase> cases = {
      {{3, 5}, {1, 0}},
      {{67, 131}, {1, 0}},                 // odd sizes across several tiles
      {{2, 5, 3, 4}, {0, 2, 1, 3}},        // [B,S,H,D] -> [B,H,S,D]
      {{2, 3, 5, 4}, {0, 2, 1, 3}},        // and back
      {{2, 5, 3, 4}, {0, 2, 3, 1}},        // [B,S,H,D] -> [B,H,D,S]
      {{2, 3, 5, 4}, {0, 1, 3, 2}},        // k^T
      {{3, 37, 70}, {2, 0, 1}},
      {{4, 1, 6, 1, 5}, {4, 3, 2, 1, 0}},  // size-1 dims
      {{2, 3, 4, 5, 6}, {3, 1, 4, 0, 2}},
      {{1, 1}, {1, 0}},
      {{7}, {0}},
  };
  for (auto& c : cases) {
    Array x = random_array(c.shape, DType::f32, 7);
    Ints perm = c.perm;
    Array y = eval1([&](const V& in) { return V{transpose(in[0], perm)}; }, {x});
    Shape want_shape;
    for (int64_t p : perm) want_shape.push_back(c.shape[p]);
    EXPECT_EQ(y.shape(), want_shape) << shape_str(c.shape) << " perm " << shape_str(perm);
    EXPECT_EQ(y.to_f32(), ref_transpose(x.to_f32(), c.shape, perm))
        << shape_str(c.shape) << " perm " << shape_str(perm);
  }
}

TEST(Transpose, AllDtypesAndLargeParallelCase) {
  for (DType d : {DType::bf16, DType::f16, DType::i32, DType::boolean}) {
    Array x = random_array({5, 33, 19}, DType::f32, 3, -3, 3).astype(d);
    for (Ints perm : {Ints{1, 2, 0}, Ints{0, 2, 1}}) {  // the second takes 8x8 register tiles plus edges
      Array y = eval1([&](const V& in) { return V{transpose(in[0], perm)}; }, {x});
      EXPECT_EQ(y.dtype(), d);
      EXPECT_EQ(y.to_f32(), ref_transpose(x.to_f32(), {5, 33, 19}, perm)) << dtype_name(d);
    }
  }
  Array big = random_array({3, 301, 257});
  Array y = eval1([](const V& in) { return V{transpose(in[0], {0, 2, 1})}; }, {big});
  EXPECT_EQ(y.to_f32(), ref_transpose(big.to_f32(), {3, 301, 257}, {0, 2, 1}));
  Array att = random_array({2, 64, 8, 32});
  Array z = eval1([](const V& in) { return V{transpose(in[0], {0, 2, 1, 3})}; }, {att});
  EXPECT_EQ(z.to_f32(), ref_transpose(att.to_f32(), {2, 64, 8, 32}, {0, 2, 1, 3}));
}

TEST(Transpose, EmptyRankZeroNegativeAndSwapAxes) {
  Array e = random_array({0, 3, 2});
  EXPECT_EQ(eval1([](const V& in) { return V{transpose(in[0], {2, 0, 1})}; }, {e}).shape(), (Shape{2, 0, 3}));
  Array s = Array::scalar(2.0f);
  EXPECT_EQ(eval1([](const V& in) { return V{transpose(in[0], {})}; }, {s}).to_f32(), (std::vector<float>{2.0f}));
  Array x = random_array({2, 3, 4});
  EXPECT_EQ(eval1([](const V& in) { return V{transpose(in[0], {-1, 0, 1})}; }, {x}).to_f32(),
            ref_transpose(x.to_f32(), {2, 3, 4}, {2, 0, 1}));
  EXPECT_EQ(eval1([](const V& in) { return V{swap_axes(in[0], 0, -1)}; }, {x}).to_f32(),
            ref_transpose(x.to_f32(), {2, 3, 4}, {2, 1, 0}));
}

TEST(Transpose, BadPermIsAnError) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{transpose(in[0], {0, 0, 1})}; }, {{DType::f32, {2, 3, 4}}},
                           {"[transpose]", "[0,0,1]", "not a permutation", "f32[2,3,4]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{transpose(in[0], {1, 0})}; }, {{DType::f32, {2, 3, 4}}},
                           {"[transpose]", "not a permutation"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{transpose(in[0], {0, 3})}; }, {{DType::f32, {2, 3}}},
                           {"[transpose]"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{swap_axes(in[0], 0, 2)}; }, {{DType::f32, {2, 3}}},
                           {"[swap_axes]", "axis 2"}));
}

TEST(Transpose, GradientAndRule) {
  EXPECT_TRUE(check_grads([](const V& in) { return V{transpose(in[0], {2, 0, 1}) * 3.0}; }, {random_array({2, 3, 4})}));
  ShardingRule r = rule_of([](const V& in) { return V{transpose(in[0], {2, 0, 1})}; }, {{DType::f32, {2, 3, 4}}});
  EXPECT_EQ(r.to_string(), "abc->cab");
}

// ---- slice --------------------------------------------------------------------------------------

TEST(Slice, MatchesReferenceWithStrides) {
  struct Case {
    Shape s;
    Ints starts, limits, strides;
  };
  std::vector<Case> cases = {
      {{7, 9}, {1, 2}, {6, 9}, {1, 1}},
      {{7, 9}, {0, 1}, {7, 8}, {3, 2}},
      {{4, 5, 6}, {0, 0, 2}, {4, 5, 6}, {1, 1, 1}},
      {{4, 5, 6}, {1, 0, 0}, {3, 5, 6}, {1, 1, 1}},  // contiguous block
      {{4, 5, 6}, {3, 4, 5}, {4, 5, 6}, {1, 1, 1}},  // one element
      {{4, 5, 6}, {2, 2, 2}, {2, 5, 6}, {1, 1, 1}},  // empty
      {{10}, {1}, {10}, {4}},
  };
  for (auto& c : cases) {
    Array x = random_array(c.s, DType::f32, 5);
    Case cc = c;
    Array y = eval1([&](const V& in) { return V{slice(in[0], cc.starts, cc.limits, cc.strides)}; }, {x});
    Shape os;
    for (size_t d = 0; d < c.s.size(); ++d)
      os.push_back(c.limits[d] > c.starts[d] ? (c.limits[d] - c.starts[d] + c.strides[d] - 1) / c.strides[d] : 0);
    EXPECT_EQ(y.shape(), os);
    EXPECT_EQ(y.to_f32(), ref_slice(x.to_f32(), c.s, c.starts, os, c.strides)) << shape_str(c.s);
  }
}

TEST(Slice, SliceAxisSplitBf16AndTransposedInput) {
  Array x = random_array({6, 8}, DType::bf16);
  Array y = eval1([](const V& in) { return V{slice_axis(in[0], -1, 3, 7)}; }, {x});
  EXPECT_EQ(y.dtype(), DType::bf16);
  EXPECT_EQ(y.to_f32(), ref_slice(x.to_f32(), {6, 8}, {0, 3}, {6, 4}, {1, 1}));
  // A slice of a transposed (non-contiguous in the original layout) input.
  Array z = random_array({5, 9});
  Array t = eval1([](const V& in) { return V{slice_axis(transpose(in[0], {1, 0}), 0, 2, 6)}; }, {z});
  EXPECT_EQ(t.to_f32(), ref_slice(ref_transpose(z.to_f32(), {5, 9}, {1, 0}), {9, 5}, {2, 0}, {4, 5}, {1, 1}));
  std::vector<Array> parts = testing::eval(
      [](const V& in) { return split(in[0], {2, 0, 3}, 1); }, {random_array({4, 5}, DType::f32, 9)});
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{4, 2}));
  EXPECT_EQ(parts[1].shape(), (Shape{4, 0}));
  EXPECT_EQ(parts[2].to_f32(), ref_slice(random_array({4, 5}, DType::f32, 9).to_f32(), {4, 5}, {0, 2}, {4, 3}, {1, 1}));
}

TEST(Slice, OutOfRangeIsAnError) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{slice(in[0], {0, 2}, {4, 7})}; }, {{DType::f32, {4, 5}}},
                           {"[slice]", "dim 1", "f32[4,5]", "limit 7"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{slice(in[0], {3, 0}, {2, 5})}; }, {{DType::f32, {4, 5}}},
                           {"[slice]", "dim 0", "start 3"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{slice(in[0], {-1, 0}, {2, 5})}; }, {{DType::f32, {4, 5}}},
                           {"[slice]", "start -1"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{slice(in[0], {0, 0}, {2, 5}, {1, 0})}; },
                           {{DType::f32, {4, 5}}}, {"[slice]", "stride 0"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{slice(in[0], {0}, {2})}; }, {{DType::f32, {4, 5}}},
                           {"[slice]", "rank 2"}));
  EXPECT_TRUE(throws_error([](const V& in) { return split(in[0], {2, 2}, 1); }, {{DType::f32, {4, 5}}},
                           {"[split]", "add up to 4", "has 5"}));
}

TEST(Slice, GradientsIncludingStrides) {
  Array x = random_array({5, 7});
  EXPECT_TRUE(check_grads([](const V& in) { return V{slice(in[0], {1, 0}, {4, 7}, {1, 3})}; }, {x}));
  EXPECT_TRUE(check_grads([](const V& in) { return V{slice(in[0], {0, 2}, {5, 6}, {2, 1})}; }, {x}));
  EXPECT_TRUE(check_grads(
      [](const V& in) {
        V p = split(in[0], {1, 4, 2}, -1);
        return V{p[0] * p[0] + slice_axis(p[1], 1, 0, 1) * 2.0 + slice_axis(p[2], 1, 1, 2)};
      },
      {x}));
}

// ---- pad ----------------------------------------------------------------------------------------

TEST(Pad, MatchesReferenceIncludingInteriorAndValue) {
  Array x = random_array({3, 4});
  Shape os;
  std::vector<float> want = ref_pad(x.to_f32(), {3, 4}, {1, 0}, {2, 3}, {0, 0}, -7.0f, &os);
  Array y = eval1([](const V& in) { return V{pad(in[0], {1, 0}, {2, 3}, -7.0)}; }, {x});
  EXPECT_EQ(y.shape(), os);
  EXPECT_EQ(y.to_f32(), want);
  std::vector<float> want2 = ref_pad(x.to_f32(), {3, 4}, {0, 2}, {1, 0}, {2, 1}, 0.5f, &os);
  Array z = eval1([](const V& in) { return V{emit_pad(in[0], {0, 2}, {1, 0}, {2, 1}, 0.5)}; }, {x});
  EXPECT_EQ(z.shape(), os);
  EXPECT_EQ(z.to_f32(), want2);
  // bf16 and i32 values, and an empty operand.
  Array b = random_array({2, 3}, DType::bf16);
  EXPECT_EQ(eval1([](const V& in) { return V{pad(in[0], {1, 1}, {0, 1}, 2.0)}; }, {b}).to_f32(),
            ref_pad(b.to_f32(), {2, 3}, {1, 1}, {0, 1}, {0, 0}, 2.0f, &os));
  Array i = Array::from_i32({1, 2, 3}, {3});
  EXPECT_EQ(eval1([](const V& in) { return V{pad(in[0], {2}, {1}, -1.0)}; }, {i}).to_i32(),
            (std::vector<int32_t>{-1, -1, 1, 2, 3, -1}));
  Array e = random_array({0, 2});
  EXPECT_EQ(eval1([](const V& in) { return V{pad(in[0], {1, 0}, {1, 1}, 4.0)}; }, {e}).to_f32(),
            std::vector<float>(6, 4.0f));
}

TEST(Pad, GradientAndErrors) {
  EXPECT_TRUE(check_grads([](const V& in) { return V{pad(in[0], {1, 2}, {0, 1}, 3.0)}; }, {random_array({3, 2})}));
  EXPECT_TRUE(
      check_grads([](const V& in) { return V{emit_pad(in[0], {1, 0}, {0, 2}, {1, 2}, 0.0)}; }, {random_array({3, 2})}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{pad(in[0], {-1, 0}, {0, 0})}; }, {{DType::f32, {3, 2}}},
                           {"[pad]", "dim 0", "non-negative"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{pad(in[0], {1}, {0, 0})}; }, {{DType::f32, {3, 2}}},
                           {"[pad]", "rank 2"}));
}

// ---- concat -------------------------------------------------------------------------------------

TEST(Concat, MatchesReferenceOnEveryAxis) {
  Array a = random_array({2, 3, 4}, DType::f32, 1), b = random_array({2, 1, 4}, DType::f32, 2),
        c = random_array({2, 0, 4}, DType::f32, 3), d = random_array({2, 5, 4}, DType::f32, 4);
  Array y = eval1([](const V& in) { return V{concat({in[0], in[1], in[2], in[3]}, 1)}; }, {a, b, c, d});
  ASSERT_EQ(y.shape(), (Shape{2, 9, 4}));
  std::vector<float> want;
  for (int i = 0; i < 2; ++i)
    for (const Array* p : {&a, &b, &c, &d}) {
      auto v = p->to_f32();
      int64_t n = p->shape()[1] * 4;
      want.insert(want.end(), v.begin() + i * n, v.begin() + (i + 1) * n);
    }
  EXPECT_EQ(y.to_f32(), want);
  Array z = eval1([](const V& in) { return V{concat({in[0], in[0]}, -1)}; }, {a});
  EXPECT_EQ(z.shape(), (Shape{2, 3, 8}));
  EXPECT_EQ(z.to_f32()[4], a.to_f32()[0]);
  Array w = eval1([](const V& in) { return V{concat({in[0], in[1]}, 0)}; },
                  {Array::from_i32({1, 2}, {2}), Array::from_i32({3}, {1})});
  EXPECT_EQ(w.to_i32(), (std::vector<int32_t>{1, 2, 3}));
}

TEST(Concat, MismatchNamesTheDim) {
  EXPECT_TRUE(throws_error([](const V& in) { return V{concat({in[0], in[1]}, 0)}; },
                           {{DType::f32, {2, 3}}, {DType::f32, {2, 4}}},
                           {"[concat]", "operand 1", "f32[2,4]", "f32[2,3]", "dim 1", "4 vs 3"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{concat({in[0], in[1]}, 0)}; },
                           {{DType::f32, {2, 3}}, {DType::bf16, {2, 3}}}, {"[concat]", "dtypes"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{concat({in[0], in[1]}, 0)}; },
                           {{DType::f32, {2, 3}}, {DType::f32, {2, 3, 1}}}, {"[concat]", "ranks"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{concat({in[0], in[1]}, 2)}; },
                           {{DType::f32, {2, 3}}, {DType::f32, {2, 3}}}, {"[concat]", "axis 2"}));
  EXPECT_TRUE(throws_error([](const V&) { return V{concat({}, 0)}; }, {}, {"[concat]", "at least one"}));
}

TEST(Concat, GradientAndRule) {
  EXPECT_TRUE(check_grads([](const V& in) { return V{concat({in[0], in[1] * in[1], in[0]}, 0)}; },
                          {random_array({2, 3}, DType::f32, 1), random_array({1, 3}, DType::f32, 2)}));
  ShardingRule r = rule_of([](const V& in) { return V{concat({in[0], in[1]}, 1)}; },
                           {{DType::f32, {4, 2}}, {DType::f32, {4, 3}}});
  EXPECT_EQ(r.to_string(), "ab,ac->ad {b: whole, c: whole, d: whole}");
}

// ---- expand_dims / squeeze ------------------------------------------------------------------------

TEST(ExpandSqueeze, InsertAndRemoveUnitDims) {
  Array x = random_array({3, 4});
  EXPECT_EQ(eval1([](const V& in) { return V{expand_dims(in[0], -1)}; }, {x}).shape(), (Shape{3, 4, 1}));
  EXPECT_EQ(eval1([](const V& in) { return V{expand_dims(in[0], 1)}; }, {x}).shape(), (Shape{3, 1, 4}));
  Array y = eval1([](const V& in) { return V{squeeze(expand_dims(in[0], 0), 0)}; }, {x});
  EXPECT_EQ(y.shape(), (Shape{3, 4}));
  EXPECT_EQ(y.to_f32(), x.to_f32());
  EXPECT_EQ(eval1([](const V& in) { return V{expand_dims(in[0], 0)}; }, {Array::scalar(1.0f)}).shape(), (Shape{1}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{squeeze(in[0], 1)}; }, {{DType::f32, {3, 4}}},
                           {"[squeeze]", "dim 1", "size 4"}));
  EXPECT_TRUE(throws_error([](const V& in) { return V{expand_dims(in[0], 3)}; }, {{DType::f32, {3, 4}}},
                           {"[expand_dims]", "axis 3"}));
}

TEST(SliceRule, FullDimsStayParallel) {
  ShardingRule r = rule_of([](const V& in) { return V{slice_axis(in[0], 1, 0, 2)}; }, {{DType::f32, {4, 6}}});
  EXPECT_EQ(r.to_string(), "ab->ac {b: whole, c: whole}");
  ShardingRule p = rule_of([](const V& in) { return V{pad(in[0], {0, 1}, {0, 0})}; }, {{DType::f32, {4, 6}}});
  EXPECT_EQ(p.to_string(), "ab->ac {b: whole, c: whole}");
}

}  // namespace
}  // namespace px
