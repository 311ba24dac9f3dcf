// Counter-based RNG: a Philox known answer, statistics, determinism, values that depend only
// on (key, element index) whatever the shape or slice, key derivation, dropout and errors.
#include <cmath>

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

Array key_array(uint32_t k0, uint32_t k1) {
  return Array::from_i32({static_cast<int32_t>(k0), static_cast<int32_t>(k1)}, {2});
}

std::vector<float> uniform(const Array& key, const Shape& shape, DType dt = DType::f32, double lo = 0, double hi = 1) {
  return eval1(
             [&](const std::vector<Tensor>& in) {
               return std::vector<Tensor>{random_uniform(in[0], shape, dt, lo, hi)};
             },
             {key})
      .to_f32();
}
std::vector<float> normal(const Array& key, const Shape& shape, DType dt = DType::f32) {
  return eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{random_normal(in[0], shape, dt)}; },
               {key})
      .to_f32();
}

TEST(Rng, PhiloxKnownAnswer) {
  // Random123's kat_vectors: philox4x32-10 of counter 0 under key 0 is
  // 6627e8d5 e169c58d bc57ac4c 9b00dbd8; uniforms keep the top 24 bits.
  auto u = uniform(key_array(0, 0), {4});
  const uint32_t want[4] = {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(u[i], static_cast<float>(want[i] >> 8) / 16777216.0f) << i;
}

TEST(Rng, UniformStatistics) {
  const int64_t n = 200000;
  auto u = uniform(key_array(1, 2), {n});
  double mean = 0, var = 0;
  for (float x : u) {
    ASSERT_GE(x, 0.0f);
    ASSERT_LT(x, 1.0f);
    mean += x;
  }
  mean /= n;
  for (float x : u) var += (x - mean) * (x - mean);
  var /= n;
  // Standard errors: sqrt(1/12/n) for the mean, sqrt(1/180/n) for the variance.
  EXPECT_NEAR(mean, 0.5, 4 * std::sqrt(1.0 / 12 / n));
  EXPECT_NEAR(var, 1.0 / 12, 4 * std::sqrt(1.0 / 180 / n));
  // Every tenth of the range gets its share.
  std::vector<int> bins(10, 0);
  for (float x : u) ++bins[static_cast<int>(x * 10)];
  for (int b : bins) EXPECT_NEAR(b, n / 10.0, 5 * std::sqrt(n * 0.1 * 0.9));
  // Scaled ranges: 16-bit results stay inside [lo, hi) even where rounding would reach hi.
  for (DType dt : {DType::f32, DType::bf16, DType::f16})
    for (auto [lo, hi] : std::vector<std::pair<double, double>>{{-3, 5}, {0.1, 0.1005}, {-1, 0}, {0, 1}}) {
      auto s = uniform(key_array(1, 2), {5000}, dt, lo, hi);
      for (float x : s) {
        ASSERT_GE(x, static_cast<float>(lo)) << dtype_name(dt) << " [" << lo << ", " << hi << ")";
        ASSERT_LT(x, hi) << dtype_name(dt) << " [" << lo << ", " << hi << ")";
      }
    }
}

TEST(Rng, NormalStatistics) {
  const int64_t n = 200000;
  auto z = normal(key_array(3, 4), {n});
  double mean = 0, m2 = 0, m4 = 0;
  int64_t within1 = 0;
  for (float x : z) {
    ASSERT_TRUE(std::isfinite(x));
    mean += x;
    m2 += x * x;
    m4 += static_cast<double>(x) * x * x * x;
    within1 += std::fabs(x) < 1;
  }
  mean /= n;
  m2 /= n;
  m4 /= n;
  EXPECT_NEAR(mean, 0.0, 4 / std::sqrt(n));
  EXPECT_NEAR(m2, 1.0, 4 * std::sqrt(2.0 / n));
  EXPECT_NEAR(m4, 3.0, 4 * std::sqrt(96.0 / n));
  double p = 0.682689492;
  EXPECT_NEAR(static_cast<double>(within1) / n, p, 4 * std::sqrt(p * (1 - p) / n));
  // Neighbouring elements (which share a Philox block) are uncorrelated.
  double c = 0;
  for (int64_t i = 0; i + 1 < n; i += 2) c += z[i] * z[i + 1];
  EXPECT_NEAR(c / (n / 2), 0.0, 4 / std::sqrt(n / 2.0));
}

TEST(Rng, DeterministicAndIndependentOfShape) {
  Array key = key_array(7, 8);
  auto flat = uniform(key, {6 * 35});
  EXPECT_EQ(uniform(key, {6 * 35}), flat);
  EXPECT_EQ(uniform(key, {6, 35}), flat);  // same values, reshaped
  EXPECT_EQ(uniform(key, {2, 3, 5, 7}), flat);
  auto prefix = uniform(key, {13});  // a shorter draw is a prefix
  EXPECT_EQ(prefix, std::vector<float>(flat.begin(), flat.begin() + 13));
  auto nflat = normal(key, {6 * 35});
  EXPECT_EQ(normal(key, {6, 35}), nflat);
  auto nprefix = normal(key, {7});
  EXPECT_EQ(nprefix, std::vector<float>(nflat.begin(), nflat.begin() + 7));
  // bf16 draws are the f32 draws rounded.
  auto b = uniform(key, {6, 35}, DType::bf16);
  for (size_t i = 0; i < flat.size(); ++i) EXPECT_EQ(b[i], bf16_to_f32(f32_to_bf16(flat[i])));
  EXPECT_TRUE(uniform(key, {0, 3}).empty());
}

TEST(Rng, ShardedSliceEqualsSliceOfGlobalDraw) {
  Array key = key_array(9, 10);
  const Shape global{6, 10};
  auto full = uniform(key, global);
  auto nfull = normal(key, global);
  for (auto [off, local] :
       std::vector<std::pair<Shape, Shape>>{{{0, 5}, {6, 5}}, {{3, 0}, {3, 10}}, {{2, 3}, {3, 4}}}) {
    for (const char* prim : {"random_uniform", "random_normal"}) {
      Attrs a{{"shape", local}, {"dtype", DType::f32}, {"global_shape", global}, {"offset", off}};
      if (std::string(prim) == "random_uniform") a.set("lo", 0.0).set("hi", 1.0);
      auto got =
          eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1(prim, {in[0]}, a)}; }, {key})
              .to_f32();
      const auto& ref = std::string(prim) == "random_uniform" ? full : nfull;
      std::vector<float> want;
      for (int64_t i = 0; i < local[0]; ++i)
        for (int64_t j = 0; j < local[1]; ++j) want.push_back(ref[(off[0] + i) * global[1] + off[1] + j]);
      EXPECT_EQ(got, want) << prim << " offset " << shape_str(off);
      // The same block with its offset as a run-time origin operand (what the partitioner emits).
      Attrs b{{"shape", local}, {"dtype", DType::f32}, {"global_shape", global}};
      if (std::string(prim) == "random_uniform") b.set("lo", 0.0).set("hi", 1.0);
      Array origin = Array::from_i32({static_cast<int32_t>(off[0]), static_cast<int32_t>(off[1])}, {2});
      auto got2 =
          eval1([&](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1(prim, in, b)}; }, {key, origin})
              .to_f32();
      EXPECT_EQ(got2, want) << prim << " origin " << shape_str(off);
    }
  }
}

TEST(Rng, KeysSeedsAndFoldIn) {
  auto draw = [](uint64_t seed, std::vector<int64_t> folds) {
    return eval1(
               [&](const std::vector<Tensor>&) {
                 Tensor k = random_key(seed);
                 for (int64_t f : folds) k = fold_in(k, f);
                 return std::vector<Tensor>{random_uniform(k, {64})};
               },
               {})
        .to_f32();
  };
  auto base = draw(1, {});
  EXPECT_EQ(draw(1, {}), base);
  EXPECT_NE(draw(2, {}), base);
  EXPECT_NE(draw(1ull << 32 | 1, {}), base);  // the high half of the seed matters
  auto f3 = draw(1, {3});
  EXPECT_EQ(draw(1, {3}), f3);
  EXPECT_NE(f3, base);
  EXPECT_NE(draw(1, {4}), f3);
  EXPECT_NE(draw(1, {3, 0}), f3);
  EXPECT_NE(draw(2, {3}), f3);
  // Different keys give (statistically) unrelated streams: few equal 24-bit values.
  int same = 0;
  auto other = draw(2, {});
  for (size_t i = 0; i < base.size(); ++i) same += base[i] == other[i];
  EXPECT_LT(same, 2);
  // The key is a real i32[2] constant.
  Array k = eval1([](const std::vector<Tensor>&) { return std::vector<Tensor>{random_key((5ull << 32) | 6)}; }, {});
  EXPECT_EQ(k.to_i32(), (std::vector<int32_t>{6, 5}));
}

TEST(Rng, DropoutMaskAndScaling) {
  Array key = key_array(11, 12);
  Array mask = eval1(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout_mask(in[0], {100000}, 0.8)}; }, {key});
  EXPECT_EQ(mask.dtype(), DType::boolean);
  int64_t kept = 0;
  for (int32_t m : mask.to_i32()) kept += m;
  EXPECT_NEAR(kept / 100000.0, 0.8, 4 * std::sqrt(0.8 * 0.2 / 100000));
  Array x = random_array({50, 40}, DType::f32, 13, 0.5f, 1.5f);
  auto out = eval(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{dropout(in[0], in[1], 0.25), dropout_mask(in[0], {50, 40}, 0.75)};
      },
      {key, x});
  auto y = out[0].to_f32(), xv = x.to_f32();
  auto m = out[1].to_i32();
  for (size_t i = 0; i < y.size(); ++i) EXPECT_FLOAT_EQ(y[i], m[i] ? xv[i] / 0.75f : 0.0f);
  // rate 0 is the identity; the gradient with respect to x is mask / keep.
  Array same =
      eval1([](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0], in[1], 0.0)}; }, {key, x});
  EXPECT_EQ(same.to_f32(), xv);
  EXPECT_TRUE(check_grads([](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0], in[1], 0.5)}; },
                          {key, random_array({4, 5}, DType::f32, 14)}));
}

TEST(Rng, CostAndShardingRule) {
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{random_normal(in[0], {4, 6})};
      },
      {{DType::i32, {2}}});
  const Node& n = g->nodes().back();
  std::vector<TensorType> in{g->type(n.inputs[0])}, out{g->type(n.outputs[0])};
  EXPECT_EQ(sharding_of(*n.prim, in, out, n.attrs).to_string(), "c->ab {c: whole}");
  EXPECT_GT(cost_of(*n.prim, in, out, n.attrs).flops, 24.0);
}

TEST(Rng, BadInputsGiveClearErrors) {
  auto u = [](Shape s, double lo, double hi) {
    return [s, lo, hi](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{random_uniform(in[0], s, DType::f32, lo, hi)};
    };
  };
  TensorType key{DType::i32, {2}};
  EXPECT_TRUE(throws_error(u({3}, 0, 1), {{DType::f32, {2}}}, {"[random_uniform] key must be i32[2]", "f32[2]"}));
  EXPECT_TRUE(throws_error(u({3}, 0, 1), {{DType::i32, {3}}}, {"[random_uniform] key must be i32[2]", "i32[3]"}));
  EXPECT_TRUE(throws_error(u({3}, 1, 1), {key}, {"[random_uniform]", "lo < hi"}));
  EXPECT_TRUE(throws_error(u({-1, 3}, 0, 1), {key}, {"[random_uniform]", "negative"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) { return std::vector<Tensor>{random_normal(in[0], {3}, DType::i32)}; }, {key},
      {"[random_normal]", "floating point"}));
  EXPECT_TRUE(throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{fold_in(in[0], 1)}; },
                           {{DType::i32, {2, 1}}}, {"[fold_in] key must be i32[2]"}));
  EXPECT_TRUE(
      throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout(in[0], in[1], 1.0)}; },
                   {key, {DType::f32, {3}}}, {"[dropout] rate must be in [0, 1)"}));
  EXPECT_TRUE(
      throws_error([](const std::vector<Tensor>& in) { return std::vector<Tensor>{dropout_mask(in[0], {3}, 1.5)}; },
                   {key}, {"[dropout_mask] keep_prob"}));
  EXPECT_TRUE(throws_error(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{
            emit1("random_normal", {in[0]},
                  Attrs{{"shape", Shape{4}}, {"dtype", DType::f32}, {"global_shape", Shape{5}}, {"offset", Shape{2}}})};
      },
      {key}, {"[random_normal]", "does not fit"}));
  auto with_origin = [](Attrs a) {
    return [a](const std::vector<Tensor>& in) { return std::vector<Tensor>{emit1("random_normal", in, a)}; };
  };
  const Attrs block{{"shape", Shape{4}}, {"dtype", DType::f32}, {"global_shape", Shape{8}}};
  EXPECT_TRUE(throws_error(with_origin(block), {key, {DType::i32, {2}}},
                           {"[random_normal] the origin operand must be i32[1]"}));
  EXPECT_TRUE(throws_error(with_origin(Attrs{{"shape", Shape{4}}, {"dtype", DType::f32}}), {key, {DType::i32, {1}}},
                           {"[random_normal] an origin operand needs the global_shape attr"}));
  EXPECT_TRUE(throws_error(with_origin(Attrs{{"shape", Shape{9}}, {"dtype", DType::f32}, {"global_shape", Shape{8}}}),
                           {key, {DType::i32, {1}}}, {"[random_normal] shape [9] exceeds global_shape [8]"}));
}

}  // namespace
}  // namespace px
