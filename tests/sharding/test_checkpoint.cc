// Checkpoints of sharded steps: TrainStep's file format, loaded onto another mesh or strategy or
// into the unsharded TrainStep (and back), continuing training as the original run does.
#include <gtest/gtest.h>

#include "parallax/io.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "recipe_check.h"
#include "testing.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::opt;
using testing::error_of;

// The original run's losses and params after continuing, to compare resumed runs with.
struct Continued {
  std::vector<float> losses;
  std::vector<Array> params;
};

// Tolerances of test_recipes.cc: the runs differ by f32 reduction order only.
void expect_matches(const Continued& got, const Continued& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " step " << i;
  ASSERT_EQ(got.params.size(), want.params.size());
  for (size_t i = 0; i < got.params.size(); ++i)
    EXPECT_TRUE(testing::all_close(got.params[i].to_f32(), want.params[i].to_f32(), 5e-5, 1e-4))
        << what << " param " << i;
}

TEST(ShardedCheckpoint, ResumesOnAnotherMeshStrategyAndUnsharded) {
  Fixture f(recipe_check::gpt_micro());
  const std::string dir = ::testing::TempDir();
  const std::string sharded_file = dir + "/px_sharded_ckpt.safetensors",
                    plain_file = dir + "/px_plain_ckpt.safetensors";

  TrainStep fsdp_tp(f.model.store(), opt(), f.loss, f.batch_types,
                    {.mesh = Mesh::cpu({{"data", 2}, {"model", 2}}),
                     .strategy = ShardingStrategy::FSDP_TP,
                     .sharding = {.fsdp_min_bytes = 1024}});
  TrainState s = fsdp_tp.init(0);
  for (int i = 0; i < 2; ++i) fsdp_tp(s, f.batch(i));
  fsdp_tp.save(sharded_file, s);

  // The file is TrainStep's format: params by path, then "<path>.<slot>", step and optimizer in the metadata.
  TrainStep plain(f.model.store(), opt(), f.loss, f.batch_types);
  SafetensorsFile file = load_safetensors(sharded_file);
  std::vector<std::string> names = f.model.store().paths(), state_names = plain.state_names();
  names.insert(names.end(), state_names.begin(), state_names.end());
  EXPECT_EQ(file.names, names);
  EXPECT_EQ(file.metadata.at("step"), "2");
  EXPECT_EQ(file.metadata.at("optimizer"), opt()->name());

  Continued original;
  for (int i = 2; i < 4; ++i) original.losses.push_back(fsdp_tp(s, f.batch(i)).loss);
  original.params = fsdp_tp.gather_params(s);

  // The same step resumes bitwise.
  TrainState same = fsdp_tp.load(sharded_file);
  EXPECT_EQ(same.step, 2);
  for (int i = 2; i < 4; ++i) EXPECT_EQ(fsdp_tp(same, f.batch(i)).loss, original.losses[i - 2]);

  // (a) the unsharded TrainStep.
  TrainState p = plain.load(sharded_file);
  EXPECT_EQ(p.step, 2);
  Continued a;
  for (int i = 2; i < 4; ++i) a.losses.push_back(plain(p, f.batch(i)).loss);
  a.params = plain.gather_params(p);
  expect_matches(a, original, "unsharded TrainStep");

  // (b) DDP on another mesh: every shard is re-cut on load.
  TrainStep ddp(f.model.store(), opt(), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 4}}), .strategy = ShardingStrategy::DDP});
  TrainState d = ddp.load(sharded_file);
  EXPECT_EQ(d.params[0].mesh(), Mesh::cpu({{"data", 4}}));
  EXPECT_TRUE(d.params[0].sharding().is_fully_replicated());
  Continued b;
  for (int i = 2; i < 4; ++i) b.losses.push_back(ddp(d, f.batch(i)).loss);
  b.params = ddp.gather_params(d);
  expect_matches(b, original, "DDP on {data: 4}");

  // The unsharded step's file loads into the FSDP_TP step exactly, with the FSDP_TP shardings.
  plain.save(plain_file, p);
  TrainState back = fsdp_tp.load(plain_file);
  EXPECT_EQ(back.step, 4);
  std::vector<Array> params = fsdp_tp.gather_params(back), state = fsdp_tp.gather_opt_state(back);
  std::vector<Array> p_params = plain.gather_params(p), p_state = plain.gather_opt_state(p);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i].to_f32(), p_params[i].to_f32()) << "param " << i;
  for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(state[i].to_f32(), p_state[i].to_f32()) << "state " << i;
  for (size_t i = 0; i < back.params.size(); ++i) EXPECT_EQ(back.params[i].sharding(), s.params[i].sharding());
}

TEST(ShardedCheckpoint, ErrorsNameTheFileTheTensorAndTheState) {
  const std::string path = ::testing::TempDir() + "/px_sharded_ckpt_errors.safetensors";
  Fixture f(recipe_check::gpt_micro());
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                 {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  step.save(path, step.init(0));

  // Another model (d_model 32) cannot load it: the first param's type differs.
  Fixture g(nn::gpt2_config("other", 256, 32, 4, 2, 128, 16));
  TrainStep other(g.model.store(), opt(), g.loss, g.batch_types,
                  {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  std::string e = error_of([&] { other.load(path); });
  EXPECT_NE(e.find(path + ": tensor '" + g.model.store().paths()[0] + "' is f32["), std::string::npos) << e;
  EXPECT_NE(e.find("but this model expects f32["), std::string::npos) << e;

  // Nor can this step save the other model's state.
  e = error_of([&] { step.save(path, other.init(0)); });
  EXPECT_NE(e.find("[TrainStep::save] the state's tensor '" + g.model.store().paths()[0] + "' is f32["),
            std::string::npos)
      << e;

  // Another optimizer's state is rejected by the file's metadata, even where its tensor names
  // would all be there (SGD with momentum keeps a subset of AdamW's slot names).
  TrainStep ada(f.model.store(), optim::adafactor({}), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  e = error_of([&] { ada.load(path); });
  EXPECT_NE(e.find("was saved with the optimizer 'adamw' but this step uses 'adafactor'"), std::string::npos) << e;
  TrainStep sgd(f.model.store(), optim::sgd({.lr = 0.1}), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  e = error_of([&] { sgd.load(path); });
  EXPECT_NE(e.find("but this step uses 'sgd'"), std::string::npos) << e;

  EXPECT_EQ(error_of([&] { step.save(path, TrainState{}); }),
            "[TrainStep::save] the state does not belong to this step (make it with TrainStep::init)");
  EXPECT_NE(error_of([&] { step.load(path + ".missing"); }).find(".missing"), std::string::npos);
}

}  // namespace
}  // namespace px
