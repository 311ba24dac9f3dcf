// Sharded training on bad input: batches that do not divide the data axes, non-finite steps, and
// device strings and meshes that do not fit.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>

#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Model {
  nn::Scope root;
  nn::Linear l1, l2;
  Model() : l1(root.sub("l1"), 4, 8), l2(root.sub("l2"), 8, 3) {}
  TrainStep::LossFn loss() {
    return [this](const std::vector<Tensor>& b) { return cross_entropy_loss(l2(tanh(l1(b[0]))), b[1]); };
  }
};
std::vector<TensorType> batch_types(int64_t n) { return {{DType::f32, {n, 4}}, {DType::i32, {n}}}; }
std::vector<Array> batch(int64_t n, float scale) {
  Array x = testing::random_array({n, 4}, DType::f32, 5);
  std::vector<float> v = x.to_f32();
  for (auto& e : v) e *= scale;
  std::vector<int32_t> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<int32_t>(i % 3);
  return {Array::from_f32(v, {n, 4}), Array::from_i32(y, {n})};
}

TEST(ShardedHardening, ABatchThatDoesNotDivideTheDataAxesIsAnError) {
  Model m;
  // DDP over 8 devices with batch 12 used to replicate the batch: 8x the work, silently.
  std::string e = error_of([&] {
    TrainStep(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), batch_types(12),
              {.mesh = Mesh::cpu({{"data", 8}}), .strategy = ShardingStrategy::DDP});
  });
  EXPECT_TRUE(has(e, "batch array 0") && has(e, "f32[12,4]") && has(e, "multiple of 8")) << e;
  EXPECT_THROW(TrainStep(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), batch_types(6),
                         {.mesh = Mesh::cpu({{"data", 4}, {"model", 2}}), .strategy = ShardingStrategy::FSDP}),
               UserError);
  EXPECT_NO_THROW(TrainStep(m.root.store(), optim::sgd({.lr = 0.1}), m.loss(), batch_types(16),
                            {.mesh = Mesh::cpu({{"data", 8}}), .strategy = ShardingStrategy::DDP}));
}

// One sharded step called from 4 threads at once, each with its own state: every call either
// updates that state as a serial run would or throws the documented error; never a wrong result.
TEST(ShardedHardening, OneStepFromFourThreadsIsCorrectOrRefused) {
  Model m;
  TrainStep step(m.root.store(), optim::adamw({.lr = 1e-2}), m.loss(), batch_types(8),
                 {.mesh = Mesh::cpu({{"data", 4}}), .strategy = ShardingStrategy::FSDP});
  const std::vector<Array> b = batch(8, 1.0f);
  const int kSteps = 60;
  std::vector<float> reference;
  {
    TrainState s = step.init(1);
    for (int k = 0; k < kSteps; ++k) reference.push_back(step(s, b).loss);
  }
  std::atomic<int> wrong{0}, refused{0}, ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      TrainState s = step.init(1);
      for (int i = 0; i < kSteps; ++i) {
        const int64_t k = s.step;
        try {
          float loss = step(s, b).loss;
          (loss == reference[k] && s.step == k + 1 ? ok : wrong)++;
        } catch (const Error& e) {
          (has(e.what(), "already running on another thread") && s.step == k ? refused : wrong)++;
        }
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(ok.load() + refused.load(), 4 * kSteps);
  EXPECT_GT(ok.load(), 0);
}

TEST(ShardedHardening, SkipNonFiniteWorksOnAMesh) {
  Model m;
  TrainStep step(m.root.store(), optim::adamw({.lr = 1e-2}), m.loss(), batch_types(8),
                 {.mesh = Mesh::cpu({{"data", 4}}), .strategy = ShardingStrategy::FSDP, .skip_nonfinite = true});
  TrainState s = step.init(1);
  EXPECT_TRUE(step(s, batch(8, 1.0f)).finite);
  std::vector<Array> params = step.gather_params(s), state = step.gather_opt_state(s);
  StepMetrics mt = step(s, batch(8, std::numeric_limits<float>::quiet_NaN()));
  EXPECT_FALSE(mt.finite);
  EXPECT_TRUE(mt.skipped);
  std::vector<Array> params2 = step.gather_params(s), state2 = step.gather_opt_state(s);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params2[i].to_f32(), params[i].to_f32());
  for (size_t i = 0; i < state.size(); ++i) EXPECT_EQ(state2[i].to_f32(), state[i].to_f32());
  EXPECT_EQ(s.step, 1);
  EXPECT_EQ(s.skipped, 1);
  s.step = int64_t{1} << 31;
  EXPECT_THROW(step(s, batch(8, 1.0f)), UserError);
}

TEST(ShardedHardening, DeviceAndMeshTextsThatDoNotFit) {
  EXPECT_THROW(parse_devices("cpu:99999999999999999999"), Error);
  EXPECT_THROW(parse_devices("cpu:-1"), Error);
  std::string e = error_of([] { Mesh::parse("a:4294967296,b:4294967296", parse_devices("cpu:8")); });
  EXPECT_TRUE(has(e, "[mesh]")) << e;
  EXPECT_THROW(Mesh::parse("a:99999999999999999999", parse_devices("cpu:8")), Error);
  EXPECT_EQ(Mesh::parse("data:-1,model:2", parse_devices("cpu:8")).size(), 8);
}

}  // namespace
}  // namespace px

namespace px {
namespace {

// Found by fuzz/fuzz_partition_spec: a name holding a quote parsed, but its printed form did not.
TEST(PartitionSpecParse, NamesThatCannotPrintBackAreRejected) {
  std::string e = testing::error_of([] { PartitionSpec::parse("P(\"a'b\")"); });
  EXPECT_TRUE(e.find("holds a quote") != std::string::npos) << e;
  EXPECT_THROW(PartitionSpec::parse("P('')"), Error);
  EXPECT_THROW(PartitionSpec::parse("P(('data', \"x'\"), 'model')"), Error);
  EXPECT_THROW(PartitionSpec::parse(std::string("P('a\nb')")), Error);
  for (const char* ok : {"P('data', None)", "P(('data', 'fsdp'), 'model')", "P(\"x\")", "P()"}) {
    PartitionSpec s = PartitionSpec::parse(ok);
    EXPECT_EQ(PartitionSpec::parse(s.to_string()), s) << ok;
  }
}

}  // namespace
}  // namespace px
