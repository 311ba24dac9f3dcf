// Checkpoints of sharded steps: TrainStep's checkpoint directory (the CheckpointManager's format)
// and its single-file export, loaded onto another mesh or strategy or into the unsharded
// TrainStep (and back), continuing training as the original run does.
#include <gtest/gtest.h>

#include <filesystem>

#include "parallax/checkpoint.h"
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

std::vector<float> f32(const Array& a) { return a.to_f32(); }

// Every array of `got` holds the same bits as `want`'s.
void expect_same(const std::vector<Array>& got, const std::vector<Array>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(f32(got[i]), f32(want[i])) << what << " array " << i;
}

TEST(ShardedCheckpoint, ResumesOnAnotherMeshStrategyAndUnsharded) {
  Fixture f(recipe_check::gpt_micro());
  const std::string dir = ::testing::TempDir();
  const std::string sharded_dir = dir + "/px_sharded_ckpt", plain_dir = dir + "/px_plain_ckpt",
                    export_file = dir + "/px_sharded_ckpt.safetensors";
  std::filesystem::remove_all(sharded_dir);
  std::filesystem::remove_all(plain_dir);

  TrainStep fsdp_tp(f.model.store(), opt(), f.loss, f.batch_types,
                    {.mesh = Mesh::cpu({{"data", 2}, {"model", 2}}),
                     .strategy = ShardingStrategy::FSDP_TP,
                     .sharding = {.fsdp_min_bytes = 1024}});
  TrainState s = fsdp_tp.init(0);
  for (int i = 0; i < 2; ++i) fsdp_tp(s, f.batch(i));
  fsdp_tp.save(sharded_dir, s);
  const std::vector<Array> saved_params = fsdp_tp.gather_params(s), saved_state = fsdp_tp.gather_opt_state(s);

  // The directory is the checkpoint format of px::CheckpointManager and pax: params by path (group
  // "params"), then "<path>.<slot>" (group "opt_state"), each array chunked by its shards on the
  // mesh that saved it; step and optimizer in the metadata.
  TrainStep plain(f.model.store(), opt(), f.loss, f.batch_types);
  std::vector<std::string> names = f.model.store().paths(), state_names = plain.state_names();
  names.insert(names.end(), state_names.begin(), state_names.end());
  const CheckpointInfo info = read_checkpoint_info(sharded_dir);
  ASSERT_EQ(info.arrays.size(), names.size());
  int split = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const CheckpointArrayInfo& a = info.arrays[i];
    EXPECT_EQ(a.name, names[i]);
    EXPECT_EQ(a.group, i < f.model.store().size() ? "params" : "opt_state") << a.name;
    EXPECT_EQ(a.mesh, "data:2,model:2") << a.name;
    const ShardedArray& held = i < s.params.size() ? s.params[i] : s.opt_state[i - s.params.size()];
    EXPECT_EQ(a.sharding, held.sharding().spec.to_string()) << a.name;
    EXPECT_EQ(a.chunk_shape, held.sharding().local_shape(held.shape())) << a.name;
    split += !held.sharding().is_fully_replicated();
  }
  EXPECT_GT(split, 0) << "the FSDP_TP plan split nothing: the test checks no re-split";
  EXPECT_EQ(info.step, 2);
  EXPECT_EQ(info.optimizer, opt()->name());

  Continued original;
  for (int i = 2; i < 4; ++i) original.losses.push_back(fsdp_tp(s, f.batch(i)).loss);
  original.params = fsdp_tp.gather_params(s);

  // The same step resumes bitwise.
  TrainState same = fsdp_tp.load(sharded_dir);
  EXPECT_EQ(same.step, 2);
  for (int i = 2; i < 4; ++i) EXPECT_EQ(fsdp_tp(same, f.batch(i)).loss, original.losses[i - 2]);

  // (a) the unsharded TrainStep: the state it loads is the saved one, bit for bit; it continues as
  // the original run does up to f32 reduction order (one device sums the batch in another order).
  TrainState p = plain.load(sharded_dir);
  EXPECT_EQ(p.step, 2);
  expect_same(plain.gather_params(p), saved_params, "unsharded load, params");
  expect_same(plain.gather_opt_state(p), saved_state, "unsharded load, optimizer state");
  Continued a;
  for (int i = 2; i < 4; ++i) a.losses.push_back(plain(p, f.batch(i)).loss);
  a.params = plain.gather_params(p);
  expect_matches(a, original, "unsharded TrainStep");

  // (b) DDP on another mesh: every shard is re-cut on load.
  TrainStep ddp(f.model.store(), opt(), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 4}}), .strategy = ShardingStrategy::DDP});
  TrainState d = ddp.load(sharded_dir);
  EXPECT_EQ(d.params[0].mesh(), Mesh::cpu({{"data", 4}}));
  EXPECT_TRUE(d.params[0].sharding().is_fully_replicated());
  expect_same(ddp.gather_opt_state(d), saved_state, "DDP load, optimizer state");
  Continued b;
  for (int i = 2; i < 4; ++i) b.losses.push_back(ddp(d, f.batch(i)).loss);
  b.params = ddp.gather_params(d);
  expect_matches(b, original, "DDP on {data: 4}");

  // The unsharded step's checkpoint loads into the FSDP_TP step exactly, with the FSDP_TP shardings.
  plain.save(plain_dir, p);
  TrainState back = fsdp_tp.load(plain_dir);
  EXPECT_EQ(back.step, 4);
  expect_same(fsdp_tp.gather_params(back), plain.gather_params(p), "params back on FSDP_TP");
  expect_same(fsdp_tp.gather_opt_state(back), plain.gather_opt_state(p), "state back on FSDP_TP");
  for (size_t i = 0; i < back.params.size(); ++i) EXPECT_EQ(back.params[i].sharding(), s.params[i].sharding());

  // The single-file export: full arrays in one safetensors file (the format TrainStep wrote before
  // checkpoints were directories), imported by load on any mesh.
  plain.save(export_file, p);
  SafetensorsFile file = load_safetensors(export_file);
  EXPECT_EQ(file.names, names);
  EXPECT_EQ(file.metadata.at("step"), "4");
  EXPECT_EQ(file.metadata.at("optimizer"), opt()->name());
  TrainState imported = fsdp_tp.load(export_file);
  EXPECT_EQ(imported.step, 4);
  expect_same(fsdp_tp.gather_opt_state(imported), plain.gather_opt_state(p), "imported state");
  for (size_t i = 0; i < imported.params.size(); ++i) EXPECT_EQ(imported.params[i].sharding(), s.params[i].sharding());

  // A directory of checkpoints (a px::CheckpointManager's, or pax's JOB_DIR/checkpoints): load reads
  // the newest committed one; checkpoint() and restore() are the same state for a manager's saves.
  const std::string managed = dir + "/px_managed_ckpts";
  std::filesystem::remove_all(managed);
  {
    CheckpointManager mgr(managed);
    mgr.save(fsdp_tp.checkpoint(same));  // step 4
    TrainState r = plain.restore(mgr.restore(4, plain.restore_options()));
    expect_same(plain.gather_params(r), fsdp_tp.gather_params(same), "a manager's checkpoint restored");
  }
  TrainState newest = plain.load(managed);
  EXPECT_EQ(newest.step, 4);
  expect_same(plain.gather_opt_state(newest), fsdp_tp.gather_opt_state(same), "the newest of a directory");
  for (const std::string& x : {sharded_dir, plain_dir, export_file, managed}) std::filesystem::remove_all(x);
}

TEST(ShardedCheckpoint, ErrorsNameTheFileTheTensorAndTheState) {
  const std::string path = ::testing::TempDir() + "/px_sharded_ckpt_errors";
  std::filesystem::remove_all(path);
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
  std::filesystem::remove_all(path);
}

}  // namespace
}  // namespace px
