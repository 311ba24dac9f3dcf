// Device memory the host cannot touch, proven on the CPU: this binary runs with PX_REF_DISCRETE=1
// (tests/CMakeLists.txt), so every buffer on a `ref` device is mapped inaccessible outside the ref
// backend's kernels and copies. A host read of one faults, naming it; everything else a user does
// with device memory (arrays in and out, training flat, accumulated, pipelined and sharded,
// checkpoints saved, restored onto another sharding and resumed, safetensors export) reaches it
// only through the backend's copies, and gives what it gives on ref devices whose memory the host
// can read (the conformance suite's models, within its tolerance).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <iostream>

#include "core/env.h"
#include "parallax/backend.h"
#include "parallax/checkpoint.h"
#include "parallax/io.h"
#include "parallax/nn.h"
#include "parallax/optim.h"
#include "parallax/sharding.h"
#include "testing.h"

namespace px {
namespace {

const Placement kRef0{0, MemoryKind::device, "ref"};

TEST(DiscreteMemory, ThisBinaryRunsInDiscreteMode) {
  ASSERT_TRUE(env().ref_discrete) << "run with PX_REF_DISCRETE=1 (ctest sets it)";
  EXPECT_FALSE(host_visible(kRef0));
  EXPECT_TRUE(host_visible({0, MemoryKind::pinned_host, "ref"}));
  EXPECT_TRUE(host_visible({}));
}

TEST(DiscreteMemoryDeathTest, AHostReadOfADeviceBufferFaultsNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Array a = Array::from_f32({1, 2, 3, 4}, {4}).to(kRef0);
  EXPECT_DEATH(
      {
        volatile float x = a.data<float>()[1];
        (void)x;
      },
      "the host touched device memory .*PX_REF_DISCRETE=1");
  Array b(DType::f32, {1024}, kRef0);
  EXPECT_DEATH(b.data<float>()[1000] = 1.0f, "the host touched device memory");
}

TEST(DiscreteMemory, ArraysReachDeviceMemoryThroughCopies) {
  const Array host = Array::from_f32({1.5f, -2, 3, 4, 5, 6}, {2, 3});
  const Array dev = host.to(kRef0);
  EXPECT_EQ(dev.placement(), kRef0);
  EXPECT_EQ(dev.to_f32(), host.to_f32());
  const Array other = dev.to({1, MemoryKind::device, "ref"});  // device to device
  EXPECT_EQ(other.clone().to_f32(), host.to_f32());
  EXPECT_EQ(other.to({0, MemoryKind::pinned_host, "ref"}).to_f32(), host.to_f32());
  EXPECT_EQ(Array::from_i32({7, -8}, {2}).to(kRef0).to_i32(), (std::vector<int32_t>{7, -8}));
  EXPECT_EQ(dev.astype(DType::bf16).to_f32(), host.to_f32());
  std::vector<float> back(6);
  copy_bytes({}, back.data(), kRef0, dev.raw(), 24);
  EXPECT_EQ(back, host.to_f32());
}

TEST(DiscreteMemory, AProgramRunsOnDeviceBuffers) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(exp(in[0]) * 2.0, {1})}; },
                 {{DType::f32, {4, 6}}});
  CompileOptions o;
  o.platform = "ref";
  auto exe = Executable::compile(*g, o);
  const float want = 6 * 2 * std::exp(0.5f);
  for (const Array& x : {Array::from_f32(std::vector<float>(24, 0.5f), {4, 6}),
                         Array::from_f32(std::vector<float>(24, 0.5f), {4, 6}).to(kRef0)})
    for (float v : exe->run({x})[0].to_f32()) EXPECT_NEAR(v, want, 1e-4);
}

// ---- training ----

nn::LmConfig tiny_gpt() { return nn::gpt2_config("gpt_discrete", 64, 16, 2, 2, 32, 8); }
constexpr int64_t kBatch = 4;

Array tokens(const nn::LmConfig& cfg, uint32_t seed) {
  std::vector<int32_t> v(static_cast<size_t>(kBatch * cfg.max_seq_len));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int32_t>((i * 7 + seed * 13 + i * i * seed) % cfg.vocab_size);
  return Array::from_i32(v, {kBatch, cfg.max_seq_len});
}

struct Trainer {
  nn::TransformerLm model;
  std::vector<TensorType> batch;
  TrainStep step;
  explicit Trainer(const TrainStepOptions& o)
      : model(tiny_gpt()),
        batch(2, TensorType{DType::i32, {kBatch, tiny_gpt().max_seq_len}}),
        step(model.store(), optim::adamw({.lr = 1e-2, .eps = 1e-5, .weight_decay = 0.1}),
             [this](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, batch, o) {}
  std::vector<float> losses(TrainState& s, int from, int steps) {
    std::vector<float> l;
    for (int i = from; i < from + steps; ++i)
      l.push_back(step(s, {tokens(model.config(), 2 * i + 1), tokens(model.config(), 2 * i + 2)}).loss);
    return l;
  }
};

TrainStepOptions on_ref(std::vector<MeshAxis> axes, ShardingStrategy strategy = ShardingStrategy::DDP,
                        int microbatches = 1) {
  TrainStepOptions o;
  o.mesh = Mesh(std::move(axes), {}, "ref");
  o.strategy = strategy;
  o.sharding.fsdp_min_bytes = 256;
  o.microbatches = microbatches;
  return o;
}

void expect_close(const std::vector<float>& want, const std::vector<float>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(std::isfinite(got[i])) << what << " step " << i;
    EXPECT_NEAR(want[i], got[i], 1e-5 * std::abs(want[i])) << what << " step " << i;
  }
}

const std::vector<float>& flat_losses() {
  static const std::vector<float> l = [] {
    Trainer r(on_ref({{"data", 1}}));
    TrainState s = r.step.init(0);
    return r.losses(s, 0, 4);
  }();
  return l;
}

TEST(DiscreteMemory, TrainingFlatAccumulatedPipelinedAndShardedAgree) {
  const std::vector<float>& want = flat_losses();
  struct Case {
    const char* what;
    TrainStepOptions o;
  };
  for (const Case& c : {Case{"accumulated over 2 microbatches", on_ref({{"data", 1}}, ShardingStrategy::DDP, 2)},
                        Case{"DDP on ref:2", on_ref({{"data", 2}})},
                        Case{"FSDP on ref:2", on_ref({{"data", 2}}, ShardingStrategy::FSDP)},
                        Case{"pipelined on stage:2", on_ref({{"stage", 2}}, ShardingStrategy::DDP, 2)},
                        Case{"pipelined with FSDP on stage:2,data:2",
                             on_ref({{"stage", 2}, {"data", 2}}, ShardingStrategy::FSDP, 2)}}) {
    std::cout << c.what << "\n";
    Trainer r(c.o);
    TrainState s = r.step.init(0);
    expect_close(want, r.losses(s, 0, 4), c.what);
  }
}

TEST(DiscreteMemory, CheckpointsSaveRestoreOntoAnotherShardingAndResume) {
  const std::string dir = ::testing::TempDir() + "/discrete_ckpt";
  std::filesystem::remove_all(dir);
  {
    Trainer r(on_ref({{"data", 2}}, ShardingStrategy::FSDP));
    TrainState s = r.step.init(0);
    r.losses(s, 0, 2);
    r.step.save(dir, s);
  }
  // Resumed on a pipeline over other devices: the last two steps as in one run.
  Trainer r(on_ref({{"stage", 2}}, ShardingStrategy::DDP, 2));
  TrainState s = r.step.load(dir);
  const std::vector<float>& want = flat_losses();
  expect_close({want[2], want[3]}, r.losses(s, 2, 2), "resumed on stage:2");

  // The saved params exported to safetensors equal the restored ones.
  export_safetensors(dir, dir + ".safetensors");
  SafetensorsFile f = load_safetensors(dir + ".safetensors");
  Trainer again(on_ref({{"data", 1}}));
  TrainState back = again.step.load(dir);
  const std::vector<Array> params = again.step.gather_params(back);
  ASSERT_EQ(f.arrays.size(), params.size());
  for (size_t i = 0; i < f.names.size(); ++i)
    EXPECT_EQ(f.arrays[i].to_f32(), params[again.model.store().index_of(f.names[i])].to_f32()) << f.names[i];
}

}  // namespace
}  // namespace px
