// dot_general and matmul: numerics against a naive loop over many dim configurations (batch
// dims, contracting on either side, transposes, odd, size-1 and empty dims, 16-bit dtypes),
// gradients against finite differences, the sharding rule, the cost, and bad-input errors.
#include <algorithm>
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

std::vector<int64_t> strides_of(const Shape& s) {
  std::vector<int64_t> st(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) st[i] = st[i + 1] * s[i + 1];
  return st;
}

std::vector<int64_t> free_of(size_t rank, const std::vector<int64_t>& b, const std::vector<int64_t>& c) {
  std::vector<int64_t> f;
  for (int64_t d = 0; d < static_cast<int64_t>(rank); ++d)
    if (std::count(b.begin(), b.end(), d) == 0 && std::count(c.begin(), c.end(), d) == 0) f.push_back(d);
  return f;
}

// The textbook definition: out[batch, lhs free, rhs free] = sum over contracting indices.
std::vector<float> naive_dot(const std::vector<float>& a, const Shape& as, const std::vector<float>& b,
                             const Shape& bs, const DotDims& d) {
  auto lf = free_of(as.size(), d.lhs_batch, d.lhs_contract), rf = free_of(bs.size(), d.rhs_batch, d.rhs_contract);
  Shape out_s, k_s;
  for (int64_t x : d.lhs_batch) out_s.push_back(as[x]);
  for (int64_t x : lf) out_s.push_back(as[x]);
  for (int64_t x : rf) out_s.push_back(bs[x]);
  for (int64_t x : d.lhs_contract) k_s.push_back(as[x]);
  auto ast = strides_of(as), bst = strides_of(bs);
  std::vector<float> out(static_cast<size_t>(numel(out_s)));
  for (int64_t o = 0; o < numel(out_s); ++o) {
    std::vector<int64_t> idx(out_s.size());
    for (int64_t r = o, k = static_cast<int64_t>(out_s.size()) - 1; k >= 0; --k) {
      idx[k] = r % out_s[k];
      r /= out_s[k];
    }
    int64_t a0 = 0, b0 = 0;
    size_t p = 0;
    for (size_t i = 0; i < d.lhs_batch.size(); ++i, ++p) {
      a0 += idx[p] * ast[d.lhs_batch[i]];
      b0 += idx[p] * bst[d.rhs_batch[i]];
    }
    for (int64_t x : lf) a0 += idx[p++] * ast[x];
    for (int64_t x : rf) b0 += idx[p++] * bst[x];
    double acc = 0;
    for (int64_t kk = 0; kk < numel(k_s); ++kk) {
      int64_t ao = a0, bo = b0;
      for (int64_t r = kk, k = static_cast<int64_t>(k_s.size()) - 1; k >= 0; --k) {
        int64_t c = r % k_s[k];
        r /= k_s[k];
        ao += c * ast[d.lhs_contract[k]];
        bo += c * bst[d.rhs_contract[k]];
      }
      acc += static_cast<double>(a[ao]) * b[bo];
    }
    out[o] = static_cast<float>(acc);
  }
  return out;
}

struct Case {
  Shape a, b;
  DotDims d;
  Shape want;
};

std::vector<Case> cases() {
  return {
      {{3, 4}, {4, 5}, {{1}, {0}, {}, {}}, {3, 5}},                            // plain
      {{4, 3}, {4, 5}, {{0}, {0}, {}, {}}, {3, 5}},                            // lhs transposed
      {{3, 4}, {5, 4}, {{1}, {1}, {}, {}}, {3, 5}},                            // rhs transposed
      {{4, 3}, {5, 4}, {{0}, {1}, {}, {}}, {3, 5}},                            // both transposed
      {{2, 3, 4}, {2, 4, 5}, {{2}, {1}, {0}, {0}}, {2, 3, 5}},                 // batched
      {{3, 2, 4}, {4, 2, 5}, {{2}, {0}, {1}, {1}}, {2, 3, 5}},                 // batch dim not leading
      {{2, 3, 4, 5}, {4, 5, 6}, {{2, 3}, {0, 1}, {}, {}}, {2, 3, 6}},          // two contracting dims
      {{2, 3, 4}, {4, 3, 5}, {{1, 2}, {1, 0}, {}, {}}, {2, 5}},                // contracting order swapped
      {{3, 4, 5}, {4, 6}, {{1}, {0}, {}, {}}, {3, 5, 6}},                      // free dims split by k: gather
      {{2, 3, 4, 5}, {2, 3, 5, 6}, {{3}, {2}, {0, 1}, {0, 1}}, {2, 3, 4, 6}},  // two batch dims
      {{3, 2, 4, 5}, {2, 3, 5, 6}, {{3}, {2}, {1, 0}, {0, 1}}, {2, 3, 4, 6}},  // batch dims permuted
      {{3, 4, 2}, {2, 4, 5}, {{1}, {1}, {2}, {0}}, {2, 3, 5}},                 // batch minor: no unit stride
      {{17, 33}, {33, 19}, {{1}, {0}, {}, {}}, {17, 19}},                      // odd sizes
      {{1, 4}, {4, 1}, {{1}, {0}, {}, {}}, {1, 1}},                            // size-1 free dims
      {{2, 1, 4}, {2, 4, 1}, {{2}, {1}, {0}, {0}}, {2, 1, 1}},
      {{1, 3, 4}, {1, 4, 5}, {{2}, {1}, {0}, {0}}, {1, 3, 5}},                 // size-1 batch
      {{3, 1}, {1, 5}, {{1}, {0}, {}, {}}, {3, 5}},                            // k = 1
      {{3}, {4}, {{}, {}, {}, {}}, {3, 4}},                                    // outer product
      {{7}, {7}, {{0}, {0}, {}, {}}, {}},                                      // inner product
      {{5, 7}, {7}, {{1}, {0}, {}, {}}, {5}},                                  // matrix-vector
      {{0, 4}, {4, 5}, {{1}, {0}, {}, {}}, {0, 5}},                            // empty m
      {{3, 0}, {0, 5}, {{1}, {0}, {}, {}}, {3, 5}},                            // empty k: zeros
      {{0, 3, 4}, {0, 4, 2}, {{2}, {1}, {0}, {0}}, {0, 3, 2}},                 // empty batch
      {{8, 64, 32}, {8, 64, 32}, {{2}, {2}, {0}, {0}}, {8, 64, 64}},           // attention scores
      {{70, 130}, {130, 90}, {{1}, {0}, {}, {}}, {70, 90}},                    // multi-threaded
  };
}

TEST(DotGeneral, MatchesNaiveLoopF32) {
  for (const Case& c : cases()) {
    Array a = random_array(c.a, DType::f32, 1), b = random_array(c.b, DType::f32, 2);
    Array got = eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{dot_general(in[0], in[1], c.d)}; },
                      {a, b});
    EXPECT_EQ(got.shape(), c.want) << shape_str(c.a) << " x " << shape_str(c.b);
    EXPECT_TRUE(all_close(got.to_f32(), naive_dot(a.to_f32(), c.a, b.to_f32(), c.b, c.d), 1e-5, 1e-5))
        << shape_str(c.a) << " x " << shape_str(c.b);
  }
}

TEST(DotGeneral, SixteenBitInputsAccumulateInF32) {
  for (DType dt : {DType::bf16, DType::f16})
    for (const Case& c : cases()) {
      Array a = random_array(c.a, dt, 3), b = random_array(c.b, dt, 4);
      std::vector<float> want = naive_dot(a.to_f32(), c.a, b.to_f32(), c.b, c.d);
      auto fn_out = [&](std::optional<DType> out) {
        return eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{dot_general(in[0], in[1], c.d, out)}; },
                     {a, b});
      };
      Array same = fn_out(std::nullopt);
      EXPECT_EQ(same.dtype(), dt);
      // One rounding of an f32-accumulated result; inputs are exact in both dtypes.
      double rt = dt == DType::bf16 ? 8e-3 : 1e-3;
      EXPECT_TRUE(all_close(same.to_f32(), want, rt, rt)) << dtype_name(dt) << " " << shape_str(c.a);
      Array wide = fn_out(DType::f32);
      EXPECT_EQ(wide.dtype(), DType::f32);
      EXPECT_TRUE(all_close(wide.to_f32(), want, 1e-5, 1e-5)) << dtype_name(dt) << " -> f32 " << shape_str(c.a);
    }
}

TEST(DotGeneral, NonContiguousInputsFromTransposes) {
  Array a = random_array({4, 3, 5}, DType::f32, 5), b = random_array({5, 4, 6}, DType::f32, 6);
  // a' = transpose(a) [3,4,5], b' = transpose(b) [4,5,6]: batched over the 4.
  Array got = eval1(
      [](const std::vector<Tensor>& in) {
        Tensor at = transpose(in[0], {1, 0, 2}), bt = transpose(in[1], {1, 0, 2});
        return std::vector<Tensor>{dot_general(at, bt, DotDims{{2}, {1}, {1}, {0}})};
      },
      {a, b});
  std::vector<float> want = naive_dot(a.to_f32(), {4, 3, 5}, b.to_f32(), {5, 4, 6}, DotDims{{2}, {0}, {0}, {1}});
  EXPECT_EQ(got.shape(), (Shape{4, 3, 6}));
  EXPECT_TRUE(all_close(got.to_f32(), want, 1e-5, 1e-5));
}

TEST(Matmul, SharedWeightBatchedAndBroadcast) {
  struct M {
    Shape a, b, want;
  };
  for (const M& m : std::vector<M>{{{2, 3, 4}, {4, 5}, {2, 3, 5}},
                                   {{3, 4}, {2, 4, 5}, {2, 3, 5}},
                                   {{2, 3, 4}, {2, 4, 5}, {2, 3, 5}},
                                   {{2, 1, 3, 4}, {5, 4, 2}, {2, 5, 3, 2}},
                                   {{6, 7}, {7, 1}, {6, 1}}}) {
    Array a = random_array(m.a, DType::f32, 7), b = random_array(m.b, DType::f32, 8);
    Array got = eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; }, {a, b});
    ASSERT_EQ(got.shape(), m.want) << shape_str(m.a) << " @ " << shape_str(m.b);
    // Reference: per output matrix, index the (broadcast) operand matrices.
    auto av = a.to_f32(), bv = b.to_f32();
    int64_t mm = m.a[m.a.size() - 2], k = m.a.back(), n = m.b.back();
    Shape batch(m.want.begin(), m.want.end() - 2);
    auto mat_index = [&](const Shape& s, int64_t flat) {  // matrix index of operand s for output batch `flat`
      Shape sb(s.begin(), s.end() - 2);
      int64_t idx = 0, stride = 1;
      for (int d = static_cast<int>(batch.size()) - 1; d >= 0; --d) {
        int64_t c = flat % batch[d];
        flat /= batch[d];
        int kd = d - static_cast<int>(batch.size() - sb.size());
        if (kd >= 0) {
          if (sb[kd] != 1) idx += c * stride;
          stride *= sb[kd];
        }
      }
      return idx;
    };
    std::vector<float> want;
    for (int64_t bi = 0; bi < numel(batch); ++bi) {
      int64_t ai = mat_index(m.a, bi) * mm * k, bj = mat_index(m.b, bi) * k * n;
      for (int64_t i = 0; i < mm; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0;
          for (int64_t q = 0; q < k; ++q) acc += static_cast<double>(av[ai + i * k + q]) * bv[bj + q * n + j];
          want.push_back(static_cast<float>(acc));
        }
    }
    EXPECT_TRUE(all_close(got.to_f32(), want, 1e-5, 1e-5)) << shape_str(m.a) << " @ " << shape_str(m.b);
  }
}

TEST(DotGeneral, GradientsMatchFiniteDifferences) {
  std::vector<Case> grad_cases = {
      {{3, 4}, {4, 5}, {{1}, {0}, {}, {}}, {}},
      {{4, 3}, {5, 4}, {{0}, {1}, {}, {}}, {}},
      {{3, 2, 4}, {4, 2, 5}, {{2}, {0}, {1}, {1}}, {}},
      {{2, 3, 4}, {4, 3, 5}, {{1, 2}, {1, 0}, {}, {}}, {}},
      {{3, 4, 5}, {4, 2}, {{1}, {0}, {}, {}}, {}},
      {{3, 2, 4, 2}, {2, 3, 2, 3}, {{3}, {2}, {1, 0}, {0, 1}}, {}},
      {{3}, {4}, {{}, {}, {}, {}}, {}},
  };
  for (const Case& c : grad_cases) {
    Array a = random_array(c.a, DType::f32, 9), b = random_array(c.b, DType::f32, 10);
    EXPECT_TRUE(check_grads(
        [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{dot_general(in[0], in[1], c.d)}; }, {a, b}))
        << shape_str(c.a) << " x " << shape_str(c.b);
  }
  for (auto [sa, sb] : std::vector<std::pair<Shape, Shape>>{{{2, 3, 4}, {4, 2}}, {{3, 4}, {2, 4, 5}},
                                                             {{2, 1, 3, 4}, {3, 4, 2}}}) {
    Array a = random_array(sa, DType::f32, 11), b = random_array(sb, DType::f32, 12);
    EXPECT_TRUE(check_grads([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                            {a, b}))
        << shape_str(sa) << " @ " << shape_str(sb);
  }
}

TEST(DotGeneral, Bf16GradientsWithF32ResultMatchF32Gradients) {
  Array a = random_array({3, 8}, DType::f32, 13), b = random_array({8, 5}, DType::f32, 14);
  auto grads = [](DType dt) {
    return [dt](const std::vector<Tensor>& in) {
      Tensor y = dot_general(cast(in[0], dt), cast(in[1], dt), DotDims{{1}, {0}, {}, {}}, DType::f32);
      Tensor loss = sum(y * y);
      auto g = gradients(loss, {in[0], in[1]});
      return std::vector<Tensor>{g[0], g[1]};
    };
  };
  Array a16 = a.astype(DType::bf16).astype(DType::f32), b16 = b.astype(DType::bf16).astype(DType::f32);
  auto want = testing::eval(grads(DType::f32), {a16, b16});
  auto got = testing::eval(grads(DType::bf16), {a16, b16});
  EXPECT_TRUE(all_close(got[0].to_f32(), want[0].to_f32(), 3e-2, 2e-2));
  EXPECT_TRUE(all_close(got[1].to_f32(), want[1].to_f32(), 3e-2, 2e-2));
}

TEST(DotGeneral, ShardingRuleAndCost) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{dot_general(in[0], in[1], DotDims{{2}, {1}, {0}, {0}})};
      },
      {{DType::f32, {4, 3, 5}}, {DType::f32, {4, 5, 7}}});
  const Node& n = g->nodes().back();
  std::vector<TensorType> in{g->type(n.inputs[0]), g->type(n.inputs[1])}, out{g->type(n.outputs[0])};
  ShardingRule r = sharding_of(*n.prim, in, out, n.attrs);
  EXPECT_EQ(r.to_string(), "abd,adc->abc {d: reduction}");
  EXPECT_EQ(r.factor_sizes, (std::vector<int64_t>{4, 3, 7, 5}));
  Cost c = cost_of(*n.prim, in, out, n.attrs);
  EXPECT_DOUBLE_EQ(c.flops, 2.0 * 4 * 3 * 5 * 7);
  EXPECT_DOUBLE_EQ(c.bytes_read, 4.0 * (4 * 3 * 5 + 4 * 5 * 7));
  EXPECT_DOUBLE_EQ(c.bytes_written, 4.0 * 4 * 3 * 7);
  // Size-1 dims take no part in sharding.
  auto g1 = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                  {{DType::f32, {1, 6}}, {DType::f32, {6, 2}}});
  const Node& n1 = g1->nodes().back();
  EXPECT_EQ(sharding_of(*n1.prim, {g1->type(n1.inputs[0]), g1->type(n1.inputs[1])}, {g1->type(n1.outputs[0])},
                        n1.attrs)
                .to_string(),
            "1b,ba->1a {b: reduction}");
}

TEST(DotGeneral, BadInputsGiveClearErrors) {
  auto dg = [](DotDims d) {
    return [d](const std::vector<Tensor>& in) { return std::vector<Tensor>{dot_general(in[0], in[1], d)}; };
  };
  auto mm = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; };
  TensorType f23{DType::f32, {2, 3}}, f45{DType::f32, {4, 5}}, f35{DType::f32, {3, 5}};
  EXPECT_TRUE(throws_error(mm, {f23, f45},
                           {"[matmul] contracting dims disagree: lhs f32[2,3] dim 1 has 3, rhs f32[4,5] dim 0 has 4"}));
  EXPECT_TRUE(throws_error(mm, {{DType::f32, {3}}, f35}, {"[matmul]", "rank >= 2", "f32[3]"}));
  EXPECT_TRUE(throws_error(mm, {f23, {DType::bf16, {3, 5}}}, {"[matmul]", "dtypes differ"}));
  EXPECT_TRUE(throws_error(mm, {{DType::f32, {2, 2, 3}}, {DType::f32, {3, 3, 5}}}, {"[matmul]", "broadcast"}));
  EXPECT_TRUE(throws_error(dg({{1}, {1}, {}, {}}), {f23, f45}, {"[dot_general] contracting dims disagree", "f32[2,3]"}));
  EXPECT_TRUE(throws_error(dg({{2}, {0}, {}, {}}), {f23, f35}, {"[dot_general]", "out of range"}));
  EXPECT_TRUE(throws_error(dg({{1}, {0}, {1}, {0}}), {f23, f35}, {"[dot_general]", "listed twice"}));
  EXPECT_TRUE(throws_error(dg({{1}, {}, {}, {}}), {f23, f35}, {"[dot_general]", "contracting dims"}));
  EXPECT_TRUE(throws_error(dg({{1}, {1}, {0}, {0}}), {{DType::f32, {2, 3}}, {DType::f32, {4, 3}}},
                           {"[dot_general] batch dims disagree"}));
  EXPECT_TRUE(throws_error(dg({{1}, {0}, {}, {}}), {{DType::i32, {2, 3}}, {DType::i32, {3, 5}}},
                           {"[dot_general]", "floating point"}));
  EXPECT_TRUE(throws_error(dg({{1}, {0}, {}, {}}), {f23, {DType::f16, {3, 5}}}, {"[dot_general]", "dtypes differ"}));
}

}  // namespace
}  // namespace px
