// Shared by the recipe equivalence tests (test_recipes.cc, test_recipes_tiny.cc): an LM fixture,
// the optimizer, and the check that a sharded AdamW run equals the unsharded TrainStep.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "testing.h"

namespace px::recipe_check {

inline Array random_tokens(const Shape& s, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> v(numel(s));
  for (auto& t : v) t = static_cast<int32_t>(rng() % vocab);
  return Array::from_i32(v, s);
}

// Micro versions of gpt2_tiny / llama_tiny (same structure, smaller dims and seq) keep this fast.
inline nn::LmConfig gpt_micro() { return nn::gpt2_config("gpt_micro", 256, 64, 4, 2, 128, 16); }
inline nn::LmConfig llama_micro() { return nn::llama_config("llama_micro", 256, 64, 4, 2, 2, 96, 16); }

struct Fixture {
  nn::TransformerLm model;
  std::vector<TensorType> batch_types;
  TrainStep::LossFn loss;
  explicit Fixture(const nn::LmConfig& cfg, int64_t batch = 8)
      : model(cfg),
        batch_types{{DType::i32, {batch, cfg.max_seq_len}}, {DType::i32, {batch, cfg.max_seq_len}}},
        loss([this](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }) {}
  std::vector<Array> batch(int i) const {
    return {random_tokens(batch_types[0].shape, model.config().vocab_size, 10 + 2 * i),
            random_tokens(batch_types[1].shape, model.config().vocab_size, 11 + 2 * i)};
  }
};

// AdamW divides by sqrt(v) + eps: with eps = 1e-8 a gradient that is zero up to rounding (the key
// biases: softmax ignores a shift shared by all keys) moves by +-lr on the rounding noise's sign,
// in either run. eps = 1e-5 bounds that to lr * noise / eps (~1e-6) and leaves real updates alone.
inline optim::OptimizerPtr opt() { return optim::adamw({.lr = 1e-2, .eps = 1e-5, .weight_decay = 0.1}); }

// The unsharded run: metrics of every step and the params / optimizer state after every step (as
// f32), computed once so that one reference serves many meshes and strategies.
struct Reference {
  nn::LmConfig cfg;
  int64_t batch = 8;  // sequences per step
  std::vector<StepMetrics> metrics;
  std::vector<std::vector<std::vector<float>>> params, opt_state;  // [step][param or slot]
  std::vector<std::string> paths;
  int steps() const { return static_cast<int>(metrics.size()); }
};

inline Reference run_reference(const nn::LmConfig& cfg, int steps = 3, int64_t batch = 8) {
  Fixture f(cfg, batch);
  TrainStep ref(f.model.store(), opt(), f.loss, f.batch_types);
  TrainState rs = ref.init(0);
  Reference r{.cfg = cfg, .batch = batch};
  r.paths = f.model.store().paths();
  for (int i = 0; i < steps; ++i) {
    r.metrics.push_back(ref(rs, f.batch(i)));
    r.params.emplace_back();
    for (const Array& a : ref.gather_params(rs)) r.params.back().push_back(a.to_f32());
    r.opt_state.emplace_back();
    for (const Array& a : ref.gather_opt_state(rs)) r.opt_state.back().push_back(a.to_f32());
  }
  return r;
}

// Runs `steps` sharded steps (default: all of the reference's) and compares them with the
// reference; returns the sharded step's plan so that callers can check what was split.
// f32 sums in another order differ by a few ulps of the largest terms; after 3 steps params differ
// by about lr * (relative gradient error) plus the eps-bounded noise above: ~1e-6, at most a few
// 1e-5 for embedding rows whose few gradient entries nearly cancel (atol 5e-5 = 0.5% of 3 lr).
inline ShardingPlan check_sharded(const Reference& ref, const Mesh& mesh, ShardingStrategy strategy,
                                  ShardingOptions sopt = {}, int steps = -1) {
  if (steps < 0) steps = ref.steps();
  Fixture f(ref.cfg, ref.batch);
  TrainStep sharded(f.model.store(), opt(), f.loss, f.batch_types, px::testing::on_mesh(mesh, strategy, sopt));
  TrainState ss = sharded.init(0);
  const std::string what = ref.cfg.name + " " + strategy_name(strategy) + " on " + mesh.to_string();
  for (int i = 0; i < steps; ++i) {
    StepMetrics a = ref.metrics[i], b = sharded(ss, f.batch(i));
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << what << " step " << i;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-4 * std::abs(a.grad_norm)) << what << " step " << i;
  }
  std::vector<Array> got = sharded.gather_params(ss);
  EXPECT_EQ(got.size(), ref.params[steps - 1].size()) << what;
  for (size_t i = 0; i < got.size() && i < ref.params[steps - 1].size(); ++i)
    EXPECT_TRUE(testing::all_close(got[i].to_f32(), ref.params[steps - 1][i], 5e-5, 1e-4))
        << what << " param " << ref.paths[i] << " after step " << steps - 1;
  std::vector<Array> st = sharded.gather_opt_state(ss);
  EXPECT_EQ(st.size(), ref.opt_state[steps - 1].size()) << what;
  for (size_t i = 0; i < st.size() && i < ref.opt_state[steps - 1].size(); ++i)
    EXPECT_TRUE(testing::all_close(st[i].to_f32(), ref.opt_state[steps - 1][i], 2e-5, 1e-3))
        << what << " state " << i << " after step " << steps - 1;
  return sharded.plan();
}

// 3 steps of the unsharded and the sharded run of `cfg` give the same losses, params and state.
inline void check_equivalent(const nn::LmConfig& cfg, const Mesh& mesh, ShardingStrategy strategy,
                             ShardingOptions sopt = {}) {
  check_sharded(run_reference(cfg, 3), mesh, strategy, std::move(sopt));
}

// What a few training steps left, for the memory tests (remat, offload) that compare settings
// bitwise with the plain step.
struct Trained {
  std::vector<StepMetrics> metrics;
  std::vector<Array> params, opt_state;
  MemoryReport memory;
  std::string schedule;  // Executable::summary()
};

inline bool bitwise_equal(const Array& a, const Array& b) {
  return a.type() == b.type() && std::memcmp(a.raw(), b.raw(), static_cast<size_t>(a.nbytes())) == 0;
}

// Losses, gradient norms, params and (when both have it) optimizer state bitwise equal.
inline void expect_same(const Trained& a, const Trained& b, const std::string& what) {
  ASSERT_EQ(a.metrics.size(), b.metrics.size()) << what;
  for (size_t i = 0; i < a.metrics.size(); ++i) {
    EXPECT_EQ(a.metrics[i].loss, b.metrics[i].loss) << what << " step " << i;
    EXPECT_EQ(a.metrics[i].grad_norm, b.metrics[i].grad_norm) << what << " step " << i;
  }
  ASSERT_EQ(a.params.size(), b.params.size()) << what;
  for (size_t i = 0; i < a.params.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.params[i], b.params[i])) << what << " param " << i;
  if (a.opt_state.empty() || b.opt_state.empty()) return;
  ASSERT_EQ(a.opt_state.size(), b.opt_state.size()) << what;
  for (size_t i = 0; i < a.opt_state.size(); ++i)
    EXPECT_TRUE(bitwise_equal(a.opt_state[i], b.opt_state[i])) << what << " state " << i;
}

}  // namespace px::recipe_check
