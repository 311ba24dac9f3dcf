// Remat policies: every policy trains bitwise like none (alone and under FSDP on 4 devices), and
// the memory the backward pass keeps shrinks as the policy saves less.
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

namespace px {
namespace {

using namespace recipe_check;

const RematPolicy kPolicies[] = {RematPolicy::full,          RematPolicy::nothing_saveable,
                                 RematPolicy::dots_saveable, RematPolicy::dots_with_no_batch_dims_saveable,
                                 RematPolicy::names,         RematPolicy::offload};

RematOptions options(RematPolicy p) {
  RematOptions o{p, {}};
  if (p == RematPolicy::names) o.names = {"attn_out"};
  return o;
}

Trained train(const nn::LmConfig& cfg, RematPolicy policy, int steps = 2) {  // with Fixture's batch of 8
  Fixture f(cfg);
  TrainStepOptions o;
  o.remat = options(policy);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Trained r;
  for (int i = 0; i < steps; ++i) r.metrics.push_back(step(s, f.batch(i)));
  r.params = step.gather_params(s);
  r.memory = step.executable().memory();
  return r;
}

int64_t activations(const MemoryReport& m) {
  return m.arena_max_by_category[static_cast<int>(MemoryCategory::activations)];
}

TEST(Remat, EveryPolicyTrainsBitwiseLikeNoneOnTinyGptAndLlama) {
  for (const nn::LmConfig& cfg : {nn::gpt2_tiny(), nn::llama_tiny()}) {
    Trained none = train(cfg, RematPolicy::none);
    for (RematPolicy p : kPolicies) expect_same(none, train(cfg, p), cfg.name + " " + remat_policy_name(p));
  }
}

TEST(Remat, KeepsLessForTheBackwardPassAsThePolicySavesLess) {
  nn::LmConfig cfg = nn::gpt2_config("gpt_remat", 256, 128, 4, 4, 512, 128);
  const int64_t none = train(cfg, RematPolicy::none, 1).memory.peak_bytes;
  const int64_t dots = train(cfg, RematPolicy::dots_saveable, 1).memory.peak_bytes;
  const int64_t full = train(cfg, RematPolicy::full, 1).memory.peak_bytes;
  const int64_t nothing = train(cfg, RematPolicy::nothing_saveable, 1).memory.peak_bytes;
  EXPECT_LT(dots, none);
  EXPECT_LT(full, dots);
  // offload saves what dots_saveable saves, in pinned_host memory: fewer activations on the device.
  const Trained dots_t = train(cfg, RematPolicy::dots_saveable, 1), off = train(cfg, RematPolicy::offload, 1);
  EXPECT_LT(activations(off.memory), activations(dots_t.memory));
  EXPECT_GT(off.memory.host_arena_bytes, 0);
  EXPECT_GT(off.memory.transfer_bytes, 0);
  EXPECT_LE(nothing, full);
}

TEST(Remat, FsdpOnFourDevicesWithRematEqualsFsdpWithout) {
  const nn::LmConfig cfg = gpt_micro();
  auto run = [&](RematPolicy p) {
    Fixture f(cfg);
    TrainStepOptions o;
    o.remat = options(p);
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                   px::testing::on_mesh(Mesh::cpu({{"data", 4}}), ShardingStrategy::FSDP, {.fsdp_min_bytes = 1024}, o));
    TrainState s = step.init(0);
    Trained r;
    for (int i = 0; i < 2; ++i) r.metrics.push_back(step(s, f.batch(i)));
    r.params = step.gather_params(s);
    return r;
  };
  Trained none = run(RematPolicy::none);
  for (RematPolicy p : {RematPolicy::full, RematPolicy::dots_saveable, RematPolicy::offload})
    expect_same(none, run(p), remat_policy_name(p));
}

int64_t planned_peak(const nn::LmConfig& cfg, RematOptions r, int64_t limit = 0) {
  Fixture f(cfg);
  TrainStepOptions o;
  o.remat = r;
  o.compile.memory_limit_bytes = limit;
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  return step.executable().memory().peak_bytes;
}

// The report splits the bytes at the peak by category and layer: the parts add up to each
// category's total, every block's params are there whole, and every block holds activations at the
// peak (the start of the backward pass) without remat, far fewer with full remat.
TEST(Remat, TheMemoryReportNamesTheLargestUsersByLayer) {
  nn::LmConfig cfg = nn::gpt2_config("gpt_remat", 256, 128, 4, 4, 512, 128);
  const MemoryReport none = train(cfg, RematPolicy::none, 1).memory;
  const MemoryReport full = train(cfg, RematPolicy::full, 1).memory;
  auto use = [](const MemoryReport& r, MemoryCategory c, const std::string& layer) {
    int64_t bytes = 0;
    for (const MemoryReport::Use& u : r.largest)
      if (u.category == c && u.layer == layer) bytes += u.bytes;
    return bytes;
  };
  std::array<int64_t, kNumMemoryCategories> sum{};
  for (const MemoryReport::Use& u : none.largest) sum[static_cast<int>(u.category)] += u.bytes;
  EXPECT_EQ(sum, none.by_category);
  for (size_t i = 1; i < none.largest.size(); ++i) EXPECT_GE(none.largest[i - 1].bytes, none.largest[i].bytes);
  Fixture f(cfg);
  int64_t block0 = 0;
  for (const nn::Param& p : f.model.params())
    if (p.path().rfind("blocks.0.", 0) == 0) block0 += p.type().nbytes();
  // The params once: the new params are written into them (donation).
  EXPECT_EQ(use(none, MemoryCategory::params, "blocks.0"), block0);
  EXPECT_EQ(use(none, MemoryCategory::params, "final_norm"), 2 * cfg.d_model * 4);  // scale and bias
  // Full remat's peak is in the backward pass of one block, whose activations are recomputed there
  // (the last block, first in the backward pass, now that gradients are freed by their updates as
  // they complete); the other blocks keep only their inputs.
  int small = 0;
  for (int b = 0; b < cfg.n_layers; ++b) {
    const std::string layer = "blocks." + std::to_string(b);
    EXPECT_GT(use(none, MemoryCategory::activations, layer), 0) << layer;
    small += 4 * use(full, MemoryCategory::activations, layer) < use(none, MemoryCategory::activations, layer);
  }
  EXPECT_GE(small, cfg.n_layers - 1) << full.to_string();
  EXPECT_NE(none.to_string().find("largest at the peak, by category and layer:\n"), std::string::npos)
      << none.to_string();
}

// A model whose step does not fit a device limit: without remat a clear report names the
// policies that fit with their peaks; with full remat or auto it trains, bitwise like none.
TEST(Remat, AStepOverTheLimitFailsWithAReportAndTrainsWithRematOrAuto) {
  nn::LmConfig cfg = nn::gpt2_config("gpt_remat", 256, 128, 4, 4, 512, 128);
  const int64_t none = planned_peak(cfg, {}), full = planned_peak(cfg, {RematPolicy::full, {}});
  ASSERT_LT(full, none);
  const int64_t limit = (none + full) / 2;
  try {
    planned_peak(cfg, {}, limit);
    FAIL() << "a step over the limit compiled";
  } catch (const UserError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("over the memory limit of " + std::to_string(limit)), std::string::npos) << m;
    EXPECT_NE(m.find("remat full: " + std::to_string(full) + " bytes (fits)"), std::string::npos) << m;
    EXPECT_NE(m.find("RematPolicy::automatic"), std::string::npos) << m;
    EXPECT_NE(m.find("largest at the peak, by category and layer:\n  activations blocks."), std::string::npos) << m;
  }
  EXPECT_EQ(planned_peak(cfg, {RematPolicy::full, {}}, limit), full);
  // auto: the least recompute that fits a budget halfway between none and full, so some but not
  // every layer is rematerialized.
  const int64_t chosen = planned_peak(cfg, {RematPolicy::automatic, {}, -1, limit});
  EXPECT_LE(chosen, limit);
  EXPECT_GT(chosen, full);
  Fixture f(cfg);
  TrainStepOptions o;
  o.remat = {RematPolicy::automatic, {}, -1, limit};
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Trained a;
  for (int i = 0; i < 2; ++i) a.metrics.push_back(step(s, f.batch(i)));
  a.params = step.gather_params(s);
  expect_same(train(cfg, RematPolicy::none), a, "auto");
  try {
    planned_peak(cfg, {RematPolicy::automatic, {}, -1, 1 << 20});
    FAIL() << "a 1 MiB budget fitted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no policy fits the budget"), std::string::npos) << e.what();
  }
}

// A model of our own: blocks of two Linear layers with a GELU between, wrapped by px::remat.
struct Mlp {
  nn::Scope root;
  std::vector<nn::Linear> layers;
  explicit Mlp(int blocks) {
    for (int i = 0; i < 2 * blocks; ++i) layers.emplace_back(root.sub("l").sub(i), i == 0 ? 8 : 64, 64);
  }
  std::vector<TensorFn> blocks() {
    std::vector<TensorFn> out;
    for (size_t i = 0; i < layers.size(); i += 2)
      out.push_back([this, i](const std::vector<Tensor>& x) {
        return std::vector<Tensor>{layers[i + 1](gelu(layers[i](x[0])))};
      });
    return out;
  }
};

TEST(Remat, RematWrapsAnyFunctionAndRematModelEachBlockOfAStack) {
  const std::vector<TensorType> types = {{DType::f32, {64, 8}}, {DType::i32, {64}}};
  const std::vector<Array> batch = {testing::random_array({64, 8}, DType::f32, 5), random_tokens({64}, 64, 6)};
  // wrap: how the stack runs; step_policy: the step's own RematOptions.
  auto run = [&](const std::function<TensorFn(std::vector<TensorFn>)>& wrap, RematPolicy step_policy) {
    Mlp m(4);
    TensorFn stack = wrap(m.blocks());
    TrainStepOptions o;
    o.remat.policy = step_policy;
    TrainStep step(
        m.root.store(), opt(), [&](const std::vector<Tensor>& b) { return cross_entropy_loss(stack({b[0]})[0], b[1]); },
        types, o);
    TrainState s = step.init(0);
    Trained r;
    for (int i = 0; i < 2; ++i) r.metrics.push_back(step(s, batch));
    r.params = step.gather_params(s);
    r.memory = step.executable().memory();
    return r;
  };
  auto plain = [](std::vector<TensorFn> blocks) {
    return TensorFn([blocks](const std::vector<Tensor>& in) {
      std::vector<Tensor> x = in;
      for (const TensorFn& b : blocks) x = b(x);
      return x;
    });
  };
  const Trained none = run(plain, RematPolicy::none);
  const Trained full =
      run([](std::vector<TensorFn> b) { return remat_model(std::move(b), RematPolicy::full); }, RematPolicy::none);
  expect_same(none, full, "remat_model full");
  EXPECT_LT(activations(full.memory), activations(none.memory));
  // A wrapped function keeps its own policy under the step's: none inside, full outside.
  const Trained inner_none =
      run([](std::vector<TensorFn> b) { return remat_model(std::move(b), RematPolicy::none); }, RematPolicy::full);
  expect_same(none, inner_none, "remat_model none under a full step");
  EXPECT_GT(activations(inner_none.memory), activations(full.memory));
  // px::remat around the whole stack, with dots_saveable.
  const Trained dots =
      run([&](std::vector<TensorFn> b) { return remat(plain(std::move(b)), RematPolicy::dots_saveable); },
          RematPolicy::none);
  expect_same(none, dots, "remat dots_saveable");
  EXPECT_LT(activations(dots.memory), activations(none.memory));
  EXPECT_THROW(remat(plain({}), RematPolicy::automatic), UserError);
  EXPECT_THROW(remat(plain({}), RematPolicy::names), UserError);
}

TEST(Remat, PoliciesParseAndNamesNeedNames) {
  EXPECT_EQ(parse_remat_policy("dots_saveable"), RematPolicy::dots_saveable);
  try {
    parse_remat_policy("most");
    FAIL() << "an unknown policy parsed";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("the policies are none, full"), std::string::npos) << e.what();
  }
  Fixture f(gpt_micro());
  TrainStepOptions o;
  o.remat.policy = RematPolicy::names;
  EXPECT_THROW(TrainStep(f.model.store(), opt(), f.loss, f.batch_types, o), UserError);
}

}  // namespace
}  // namespace px
