// One training-step type: TrainStep on one device and on a mesh keep the same state type and
// answer the same calls; a state of one does not silently run in the other.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "parallax/memory.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::gpt_micro;
using recipe_check::opt;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(TrainStepType, OneDeviceIsAOneDeviceMeshWithTheSameState) {
  Fixture f(gpt_micro());
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types);
  TrainState s = step.init(0);
  ASSERT_EQ(s.params.size(), static_cast<size_t>(f.model.store().size()));
  for (const ShardedArray& p : s.params) {
    EXPECT_EQ(p.mesh().size(), 1);
    EXPECT_EQ(p.shards().size(), 1u);
    EXPECT_TRUE(p.sharding().is_fully_replicated());
  }
  // The plan: every param replicated, its whole size on the one device.
  ASSERT_EQ(step.plan().params.size(), s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i)
    EXPECT_EQ(step.plan().params[i].bytes_per_device, s.params[i].shards()[0].nbytes());
  EXPECT_TRUE(has(step.table(), step.plan().params[0].path)) << step.table();
  EXPECT_TRUE(has(step.collectives_table(), "one device")) << step.collectives_table();
  EXPECT_EQ(step.process(), 0);
  EXPECT_GT(step.peak_bytes(), 0);
  // One path: the same program and executable types on one device as on a mesh.
  EXPECT_EQ(step.program().positions().size(), 1u);
  EXPECT_EQ(&step.executable(), &step.program().executable());

  // The same model on a 2-device mesh: the same calls, the same state type.
  Fixture g(gpt_micro());
  TrainStep ddp(g.model.store(), opt(), g.loss, g.batch_types,
                {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  TrainState d = ddp.init(0);
  EXPECT_EQ(d.params[0].shards().size(), 2u);
  EXPECT_EQ(ddp.program().positions().size(), 2u);
  EXPECT_GT(ddp.executable().peak_bytes(), 0);
  for (int i = 0; i < 2; ++i) {
    StepMetrics a = step(s, f.batch(i)), b = ddp(d, g.batch(i));
    EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << "step " << i;
  }
  std::vector<Array> one = step.gather_params(s), two = ddp.gather_params(d);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i)
    EXPECT_TRUE(testing::all_close(one[i].to_f32(), two[i].to_f32(), 1e-4, 1e-5)) << i;

  // A state of one does not run in the other: each error names the way out.
  std::string e = error_of([&] { step(d, f.batch(2)); });
  EXPECT_TRUE(has(e, "is split over Mesh{data: 2}")) << e;
  EXPECT_TRUE(has(error_of([&] { ddp(s, g.batch(2)); }), "TrainStepOptions::mesh"));
  EXPECT_TRUE(has(e, "TrainStepOptions::mesh")) << e;
  EXPECT_EQ(s.step, 2);
}

TEST(TrainStepType, ParamsSetOneByOneEqualInitOnOneDevice) {
  Fixture f(gpt_micro());
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types);
  std::vector<Array> params = f.model.store().init(3);
  TrainState a = step.init(params);
  TrainState b = step.begin_state();
  // Half the params as full arrays, half through a box reader (what the sliced HF loader hands out).
  for (size_t i = 0; i < params.size(); ++i) {
    if (i % 2 == 0) {
      step.set_param(b, static_cast<int>(i), params[i]);
    } else {
      const Array& src = params[i];
      step.set_param(b, static_cast<int>(i), [&](const std::vector<int64_t>& offsets, Array& out) {
        for (int64_t o : offsets) ASSERT_EQ(o, 0);
        ASSERT_EQ(out.type(), src.type());
        std::memcpy(out.raw(), src.raw(), static_cast<size_t>(src.nbytes()));
      });
    }
  }
  EXPECT_TRUE(has(error_of([&] { step.set_param(b, -1, params[0]); }), "outside [0, "));
  EXPECT_TRUE(has(error_of([&] { step.set_param(b, 0, params[1]); }), "set_param: param '"));
  StepMetrics ma = step(a, f.batch(0)), mb = step(b, f.batch(0));
  EXPECT_EQ(ma.loss, mb.loss);
  std::vector<Array> pa = step.gather_params(a), pb = step.gather_params(b);
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_f32(), pb[i].to_f32()) << i;
  std::vector<Array> sa = step.gather_opt_state(a), sb = step.gather_opt_state(b);
  for (size_t i = 0; i < sa.size(); ++i) EXPECT_EQ(sa[i].to_f32(), sb[i].to_f32()) << i;
}

// init(seed) under FSDP on 8 devices: each device generates its own shard (nothing whole), so the
// host's high-water mark during init is the state's shards plus one param being generated, and the
// params are bitwise the unsharded init.
TEST(TrainStepType, InitGeneratesEachShardWhereItLives) {
  Fixture f(gpt_micro());
  ShardingOptions every;
  every.fsdp_min_bytes = 0;  // every param that divides is split
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                 px::testing::on_mesh(Mesh({{"data", 8}}), ShardingStrategy::FSDP, every));
  int64_t largest = 0, whole = 0;
  for (const TensorType& t : f.model.store().types()) {
    largest = std::max(largest, numel(t.shape) * 4);  // generated as f32
    whole += t.nbytes();
  }
  std::vector<int64_t> on_device(8);
  for (int d = 0; d < 8; ++d) on_device[d] = memory_stats({d}).bytes_in_use;
  const int64_t before = platform_memory_stats("cpu").bytes_in_use;
  reset_platform_peak_memory("cpu");
  TrainState s = step.init(7);
  const MemoryStats after = platform_memory_stats("cpu");
  const int64_t held = after.bytes_in_use - before, peak = after.peak_bytes_in_use - before;
  EXPECT_LE(peak, held + largest) << "held " << held << ", largest param " << largest;
  // Params and AdamW's two slots, each split 8 ways: 3/8 of the model per device.
  for (int d = 0; d < 8; ++d)
    EXPECT_LT(memory_stats({d}).bytes_in_use - on_device[d], whole / 2) << "device " << d;
  int split = 0;
  for (const ShardedArray& p : s.params) split += !p.sharding().is_fully_replicated();
  EXPECT_GT(split, 0) << "no param of the FSDP plan is split";
  const std::vector<Array> want = f.model.store().init(7), got = step.gather_params(s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), static_cast<size_t>(want[i].nbytes())), 0) << i;
  // A box in the middle of a param (not whole rows) is that box of the whole param.
  const nn::ParamSpec& spec = f.model.store().spec(0);
  ASSERT_EQ(spec.type.shape.size(), 2u);
  Array box(spec.type.dtype, {3, 5});
  nn::init_box(spec, 7, {2, 4}, box);
  const Array full = nn::init_array(spec, 7);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 5; ++c)
      EXPECT_EQ(box.data<float>()[r * 5 + c], full.data<float>()[(2 + r) * spec.type.shape[1] + 4 + c]) << r << c;
  EXPECT_THROW(nn::init_box(spec, 7, {spec.type.shape[0] - 2, 0}, box), Error);
}

TEST(TrainStepType, AFailedCallLeavesTheStateWhole) {
  Fixture f(gpt_micro());
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types);
  TrainState s = step.init(0);
  const std::vector<float> before = step.gather_params(s)[0].to_f32();
  std::vector<Array> bad = f.batch(0);
  bad[1] = Array(DType::i32, {4, 16});
  EXPECT_TRUE(has(error_of([&] { step(s, bad); }), "batch array 1 has type"));
  // Every param and slot is still in the state, unchanged, and the step goes on from it.
  EXPECT_EQ(step.gather_params(s)[0].to_f32(), before);
  EXPECT_EQ(s.step, 0);
  EXPECT_TRUE(std::isfinite(step(s, f.batch(0)).loss));
  EXPECT_EQ(s.step, 1);
}

// Token ids out of the vocabulary would be clamped by the embedding lookup (training on the wrong
// rows) and make NaN in the loss: the step refuses them, naming the batch input and the value, on
// one device and on a mesh.
TEST(TrainStepType, TokensOutsideTheVocabularyAreRefused) {
  Fixture f(gpt_micro());
  TrainStep one(f.model.store(), opt(), f.loss, f.batch_types);
  TrainStep ddp(f.model.store(), opt(), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  TrainState a = one.init(0), b = ddp.init(0);
  for (int32_t bad : {-1, 256, 1 << 30}) {
    for (int input : {0, 1}) {
      std::vector<Array> batch = f.batch(0);
      batch[input].data<int32_t>()[5] = bad;
      std::string e = error_of([&] { one(a, batch); });
      EXPECT_TRUE(has(e, "batch input " + std::to_string(input) + " holds " + std::to_string(bad))) << e;
      EXPECT_TRUE(has(e, "outside [0, 256)")) << e;
      e = error_of([&] { ddp(b, batch); });
      EXPECT_TRUE(has(e, "holds " + std::to_string(bad))) << e;
    }
  }
  EXPECT_EQ(a.step, 0);
  EXPECT_TRUE(std::isfinite(one(a, f.batch(0)).loss));
}

TEST(TrainStepType, ForwardFnOnOneDeviceAndOnAMeshAgree) {
  Fixture f(gpt_micro());
  TensorType tok = f.batch_types[0];
  auto fn = [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{f.model.logits(b[0])}; };
  std::vector<Array> params = f.model.init(0), batch = {f.batch(0)[0]};
  ForwardFn one(f.model.store(), fn, {tok});
  ForwardFn fsdp(
      f.model.store(), fn, {tok},
      {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::FSDP, .sharding = {.fsdp_min_bytes = 1024}});
  EXPECT_TRUE(testing::all_close(fsdp(params, batch)[0].to_f32(), one(params, batch)[0].to_f32(), 1e-5, 1e-5));
  EXPECT_EQ(fsdp.sharded().plan().strategy, ShardingStrategy::FSDP);
  // One path: both have a plan, a sharded executable and the local program it runs.
  EXPECT_EQ(one.sharded().plan().mesh.size(), 1);
  EXPECT_EQ(&one.executable(), &one.sharded().executable().executable());
  EXPECT_GT(fsdp.executable().peak_bytes(), 0);
}

}  // namespace
}  // namespace px
