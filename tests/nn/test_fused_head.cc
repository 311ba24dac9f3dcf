// LmConfig::fused_head: next_token_loss through linear_cross_entropy trains as the unfused head
// and loss do (losses and params within f32 rounding over a few AdamW steps, tied and untied
// heads, on one device and on a 2-device data-parallel mesh), bf16 steps agree within bf16
// rounding, and the planned peak of a step falls by at least the logits buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::opt;

nn::LmConfig fused(nn::LmConfig c, bool on = true) {
  c.fused_head = on;
  return c;
}

struct Trained {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

Trained train(const nn::LmConfig& cfg, int steps, TrainStepOptions o = {}) {
  Fixture f(cfg);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Trained r;
  for (int i = 0; i < steps; ++i) r.losses.push_back(step(s, f.batch(i)).loss);
  for (const Array& a : step.gather_params(s)) r.params.push_back(a.to_f32());
  return r;
}

void expect_same(const Trained& got, const Trained& want, double loss_rtol, double param_atol,
                 const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], loss_rtol * std::abs(want.losses[i])) << what << " step " << i;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_TRUE(testing::all_close(got.params[i], want.params[i], param_atol, 1e-5)) << what << " param " << i;
}

void expect_trains_as_unfused(const nn::LmConfig& cfg) {
  const Trained want = train(cfg, 3);
  expect_same(train(fused(cfg), 3), want, 1e-5, 5e-5, cfg.name + " one device");
  expect_same(train(fused(cfg), 3, testing::on_mesh(Mesh::cpu({{"data", 2}}), ShardingStrategy::DDP)), want, 1e-5, 5e-5,
              cfg.name + " cpu:2 data parallel");
}

// The tied GPT head (the embedding table, [V, D]) and the untied Llama one (a Linear, [D, V]).
TEST(FusedHead, TiedHeadTrainsAsUnfusedOnOneDeviceAndDataParallel) {
  expect_trains_as_unfused(recipe_check::gpt_micro());
}
TEST(FusedHead, UntiedHeadTrainsAsUnfusedOnOneDeviceAndDataParallel) {
  expect_trains_as_unfused(recipe_check::llama_micro());
}

// bf16 matmuls: the unfused head rounds its logits to bf16 before the loss, the fused one does
// not, so the two agree within bf16 rounding (and the fused loss is the more exact one).
TEST(FusedHead, Bf16StepsAgreeWithinBf16Rounding) {
  nn::LmConfig cfg = recipe_check::gpt_micro();
  cfg.compute_dtype = DType::bf16;
  const Trained want = train(cfg, 2), got = train(fused(cfg), 2);
  for (size_t i = 0; i < want.losses.size(); ++i) EXPECT_NEAR(got.losses[i], want.losses[i], 1e-2 * want.losses[i]);
}

// Vocabulary 8192 over 8 x 32 positions: the logits are 8 MiB of f32, as is their gradient.
TEST(FusedHead, ThePlannedPeakFallsByAtLeastTheLogits) {
  nn::LmConfig cfg = nn::gpt2_config("wide_vocab", 8192, 64, 4, 1, 128, 32);
  auto peak = [&](bool on) {
    Fixture f(fused(cfg, on));
    return TrainStep(f.model.store(), opt(), f.loss, f.batch_types).peak_bytes();
  };
  const int64_t logits = int64_t{8} * 32 * 8192 * 4, unfused = peak(false), fused_peak = peak(true);
  EXPECT_GE(unfused - fused_peak, logits) << "unfused " << unfused << " fused " << fused_peak;
}

// A target outside the vocabulary is refused at the step's boundary, naming the fused head's
// classes, as the unfused loss's is (not a NaN loss).
TEST(FusedHead, ATargetOutsideTheVocabularyIsNamed) {
  Fixture f(fused(recipe_check::gpt_micro()));
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types);
  TrainState s = step.init(0);
  std::vector<Array> batch = f.batch(0);
  batch[1].data<int32_t>()[5] = 256;
  const std::string e = testing::user_error_of([&] { step(s, batch); });
  EXPECT_NE(e.find("batch input 1 holds 256 at flat index 5, outside [0, 256)"), std::string::npos) << e;
  EXPECT_NE(e.find("linear_cross_entropy"), std::string::npos) << e;
}

TEST(FusedHead, IsListedInTheConfigOnlyWhenOn) {
  EXPECT_EQ(recipe_check::gpt_micro().to_string().find("fused_head"), std::string::npos);
  EXPECT_NE(fused(recipe_check::gpt_micro()).to_string().find("fused_head = true"), std::string::npos);
}

}  // namespace
}  // namespace px
