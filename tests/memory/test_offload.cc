// Offload: params and optimizer state kept in pinned_host memory train bitwise like a step that
// keeps them on the device (alone, with remat and under FSDP on 4 devices); fetched params occupy
// at most (prefetch depth + 1) layers of device memory; a step over a device limit trains with
// offload and fails with a report without it.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "parallax/auto.h"
#include "parallax/plan.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "parallax/train.h"

namespace px {
namespace {

using namespace recipe_check;

OffloadOptions offload(std::vector<std::string> params, bool state, int depth = 1) {
  OffloadOptions o;
  o.params = std::move(params);
  o.optimizer_state = state;
  o.prefetch_depth = depth;
  return o;
}

Trained train(const nn::LmConfig& cfg, const OffloadOptions& off, RematPolicy remat = RematPolicy::none,
              int steps = 2) {
  Fixture f(cfg);
  TrainStepOptions o;
  o.offload = off;
  o.remat.policy = remat;
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Trained r;
  for (int i = 0; i < steps; ++i) r.metrics.push_back(step(s, f.batch(i)));
  r.params = step.gather_params(s);
  r.opt_state = step.gather_opt_state(s);
  r.memory = step.executable().memory();
  r.schedule = step.executable().summary();
  return r;
}

int64_t category(const MemoryReport& m, MemoryCategory c) { return m.arena_max_by_category[static_cast<int>(c)]; }

TEST(Offload, EverySettingTrainsBitwiseLikeNoneOnTinyGptAndLlama) {
  for (const nn::LmConfig& cfg : {nn::gpt2_tiny(), nn::llama_tiny()}) {
    Trained none = train(cfg, {});
    expect_same(none, train(cfg, offload({"*"}, false, 0)), cfg.name + " params, no prefetch");
    expect_same(none, train(cfg, offload({"*"}, false, 2)), cfg.name + " params, prefetch 2");
    expect_same(none, train(cfg, offload({}, true)), cfg.name + " optimizer state");
    expect_same(none, train(cfg, offload({"blocks.*"}, true)), cfg.name + " block params and optimizer state");
    expect_same(none, train(cfg, offload({"*"}, true), RematPolicy::full), cfg.name + " everything, remat full");
  }
}

TEST(Offload, StateLivesInPinnedHostAndTheScheduleShowsEveryTransfer) {
  const nn::LmConfig cfg = gpt_micro();
  Fixture f(cfg);
  TrainStepOptions o;
  o.offload = offload({"*"}, true);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  step(s, f.batch(0));
  int64_t state_bytes = 0;
  for (const auto* group : {&s.params, &s.opt_state})
    for (const ShardedArray& sa : *group) {
      const Array& a = sa.shards().at(0);
      EXPECT_EQ(a.placement().kind, MemoryKind::pinned_host);
      state_bytes += a.nbytes();
    }
  const MemoryReport m = step.executable().memory();
  EXPECT_EQ(m.host_input_bytes, state_bytes);
  // The gradient norm and lr; the new params and state are written into the old ones (donated).
  EXPECT_EQ(m.host_output_bytes, 2 * 4);
  EXPECT_EQ(m.donated_bytes, state_bytes);
  // On the device: the batch and the step counter in, the loss out.
  int64_t batch_bytes = 4;
  for (const TensorType& t : f.batch_types) batch_bytes += t.nbytes();
  EXPECT_EQ(m.input_bytes, batch_bytes);
  EXPECT_EQ(m.output_bytes, 4);
  // Every param is fetched at least once (twice when the backward pass reads it too) and every
  // gradient goes to the host: at least two transfers per param, moving at least twice the params.
  const std::string sched = step.executable().summary();
  size_t fetches = 0;
  for (size_t at = sched.find("transfer.start"); at != std::string::npos; at = sched.find("transfer.start", at + 1))
    ++fetches;
  EXPECT_GE(fetches, 2 * s.params.size()) << sched;
  EXPECT_GE(m.transfer_bytes, 2 * (state_bytes / 3));
  EXPECT_NE(m.to_string().find("pinned_host"), std::string::npos);
}

// Params offloaded, optimizer state on the device: the update is split so that only its last part
// (new = old - step) runs on the host. Per param about four copies cross per step (fetched for the
// forward and the backward pass, the tied embedding at both ends of the model, the step sent
// back); the gradient and both moments there and back would make it seven.
TEST(Offload, ParamsAloneMoveOneStepPerParamToTheHost) {
  const nn::LmConfig cfg = gpt_micro();
  Fixture f(cfg);
  TrainStepOptions o;
  o.offload = offload({"*"}, false);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  step(s, f.batch(0));
  int64_t param_bytes = 0;
  for (const ShardedArray& sa : s.params) {
    EXPECT_EQ(sa.shards().at(0).placement().kind, MemoryKind::pinned_host);
    param_bytes += sa.shards().at(0).nbytes();
  }
  for (const ShardedArray& sa : s.opt_state) EXPECT_EQ(sa.shards().at(0).placement().kind, MemoryKind::device);
  const MemoryReport m = step.executable().memory();
  EXPECT_GT(m.transfer_bytes, param_bytes);
  EXPECT_LE(m.transfer_bytes, 4 * param_bytes) << step.executable().summary();
}

// The params fetched into device memory at once: at most (prefetch depth + 1) layers, where a
// layer is one block's params or one param outside the blocks (the embedding table, the final norm).
TEST(Offload, KeepsAtMostPrefetchDepthPlusOneLayersOfParamsOnTheDevice) {
  const nn::LmConfig cfg = nn::gpt2_config("gpt_offload", 256, 64, 2, 6, 256, 16);
  Fixture f(cfg);
  std::map<std::string, int64_t> layer_bytes;
  int64_t all = 0;
  const std::vector<TensorType> types = f.model.store().types();
  const std::vector<std::string> paths = f.model.store().paths();
  for (size_t i = 0; i < paths.size(); ++i) {
    std::string layer = paths[i].rfind("blocks.", 0) == 0 ? paths[i].substr(0, paths[i].find('.', 7)) : paths[i];
    layer_bytes[layer] += (types[i].nbytes() + 63) / 64 * 64;
    all += types[i].nbytes();
  }
  int64_t largest = 0;
  for (auto& [k, v] : layer_bytes) largest = std::max(largest, v);
  const int64_t none = category(train(cfg, {}, RematPolicy::none, 1).memory, MemoryCategory::params);
  EXPECT_EQ(none, 0);               // params are inputs then, not arena buffers
  for (bool state : {true, false})  // the update on the host, or on the device
    for (int depth : {0, 1, 2}) {
      Trained t = train(cfg, offload({"*"}, state, depth), RematPolicy::none, 1);
      const int64_t fetched = category(t.memory, MemoryCategory::params);
      EXPECT_GT(fetched, 0) << depth;
      EXPECT_LE(fetched, (depth + 1) * largest) << "prefetch depth " << depth << " state " << state << "\n"
                                                << t.schedule;
      EXPECT_LT(fetched, all / 2) << depth;
    }
}

// A model whose step does not fit a device limit: without offload the report names offload (with
// its planned peak) among the settings that fit; with it the step trains, bitwise like none.
TEST(Offload, AStepOverTheDeviceLimitTrainsWithOffloadAndFailsWithTheReportWithout) {
  const nn::LmConfig cfg = nn::gpt2_config("gpt_offload", 512, 128, 4, 4, 512, 16);
  const int64_t none = train(cfg, {}, RematPolicy::none, 1).memory.peak_bytes;
  const int64_t off = train(cfg, offload({"*"}, true), RematPolicy::none, 1).memory.peak_bytes;
  ASSERT_LT(off, none / 2);
  const int64_t limit = (none + off) / 2;
  Fixture f(cfg);
  TrainStepOptions o;
  o.compile.memory_limit_bytes = limit;
  try {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
    FAIL() << "a step over the limit compiled";
  } catch (const UserError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("over the memory limit of " + std::to_string(limit)), std::string::npos) << m;
    EXPECT_NE(m.find("offload params and optimizer state: " + std::to_string(off) + " bytes (fits)"), std::string::npos)
        << m;
    EXPECT_NE(m.find("TrainStepOptions::offload"), std::string::npos) << m;
  }
  o.offload = offload({"*"}, true);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  EXPECT_LE(step.executable().memory().peak_bytes, limit);
  TrainState s = step.init(0);
  Trained a;
  for (int i = 0; i < 2; ++i) a.metrics.push_back(step(s, f.batch(i)));
  a.params = step.gather_params(s);
  expect_same(train(cfg, {}), a, "offload under the limit");
}

// Device 0 with a capacity, as a GPU has: the step that does not fit fails at compile time with the
// report (not at run time); offloaded, it trains within the capacity, and allocations past it throw.
TEST(Offload, ADeviceWithACapacityTrainsTheStepThatFitsIt) {
  const nn::LmConfig cfg = nn::gpt2_config("gpt_offload", 512, 128, 4, 4, 512, 16);
  const int64_t none = train(cfg, {}, RematPolicy::none, 1).memory.peak_bytes;
  const int64_t off = train(cfg, offload({"*"}, true), RematPolicy::none, 1).memory.peak_bytes;
  const Placement dev{0};
  struct Reset {
    Placement p;
    ~Reset() { set_memory_capacity(p, 0); }
  } reset{dev};
  Fixture f(cfg);
  const int64_t capacity = memory_stats(dev).bytes_in_use + (none + off) / 2;
  set_memory_capacity(dev, capacity);
  reset_peak_memory(dev);
  EXPECT_EQ(memory_capacity(dev), capacity);
  try {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types);
    FAIL() << "a step over the device's capacity compiled";
  } catch (const UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("offload params and optimizer state: " + std::to_string(off) + " bytes (fits)"),
        std::string::npos)
        << e.what();
  }
  TrainStepOptions o;
  o.offload = offload({"*"}, true);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  step(s, f.batch(0));
  EXPECT_LE(memory_stats(dev).peak_bytes_in_use, capacity);
  EXPECT_THROW(Array(DType::f32, {capacity / 4}, dev), UserError);
  EXPECT_THROW(set_memory_capacity(dev, -1), UserError);
}

TEST(Offload, FsdpOnFourDevicesWithOffloadEqualsFsdpWithout) {
  const nn::LmConfig cfg = gpt_micro();
  auto run = [&](const OffloadOptions& off) {
    Fixture f(cfg);
    TrainStepOptions o;
    o.offload = off;
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                   px::testing::on_mesh(Mesh::cpu({{"data", 4}}), ShardingStrategy::FSDP, {.fsdp_min_bytes = 1024}, o));
    TrainState s = step.init(0);
    Trained r;
    for (int i = 0; i < 2; ++i) r.metrics.push_back(step(s, f.batch(i)));
    r.params = step.gather_params(s);
    r.opt_state = step.gather_opt_state(s);
    r.memory = step.program().memory();
    for (const ShardedArray& p : s.params)
      EXPECT_EQ(p.shards()[0].placement().kind, off.params.empty() ? MemoryKind::device : MemoryKind::pinned_host);
    return r;
  };
  Trained none = run({});
  Trained both = run(offload({"*"}, true));
  expect_same(none, both, "FSDP with params and optimizer state offloaded");
  EXPECT_LT(both.memory.peak_bytes, none.memory.peak_bytes);
  EXPECT_GT(both.memory.host_input_bytes, 0);
  expect_same(none, run(offload({"*"}, false, 0)), "FSDP with params offloaded, no prefetch");
}

// The cost model and AUTO plan the offloaded step: less device memory, the transfers timed on the
// host link (PCIe on an H100 node).
TEST(Offload, TheCostModelAndAutoCountOffload) {
  const nn::LmConfig cfg = gpt_micro();
  const Cluster cl = load_cluster("h100x8");
  const Mesh mesh = Mesh::cpu({{"data", 4}});
  StepSetup setup;
  setup.batch = 8;
  setup.seq = cfg.max_seq_len;
  const StepCost base = cost_recipes(cfg, cl.apply(mesh), cl, setup, {ShardingStrategy::FSDP}).at(0).cost;
  setup.offload = offload({"*"}, true);
  const StepCost off = cost_recipes(cfg, cl.apply(mesh), cl, setup, {ShardingStrategy::FSDP}).at(0).cost;
  EXPECT_LT(off.memory.peak_bytes, base.memory.peak_bytes);
  EXPECT_GT(off.memory.host_peak_bytes(), 0);
  EXPECT_EQ(base.transfer_s, 0);
  EXPECT_NEAR(off.transfer_s, off.memory.transfer_bytes / cl.device.host_link_bandwidth, 1e-12);

  Fixture f(cfg);
  TrainStepOptions o;
  o.offload = offload({"*"}, true);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types,
                 px::testing::on_mesh(mesh, ShardingStrategy::AUTO, {.auto_cluster = "h100x8"}, o));
  TrainState s = step.init(0);
  EXPECT_TRUE(std::isfinite(step(s, f.batch(0)).loss));
  EXPECT_EQ(s.params[0].shards()[0].placement().kind, MemoryKind::pinned_host);
  EXPECT_GT(step.program().memory().host_input_bytes, 0);
}

TEST(Offload, BadOptionsAndMisplacedArraysGetClearErrors) {
  const nn::LmConfig cfg = gpt_micro();
  Fixture f(cfg);
  TrainStepOptions o;
  o.offload = offload({"decoder.*"}, false);
  try {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
    FAIL() << "a pattern matching no param was accepted";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("'decoder.*' matches no param"), std::string::npos) << e.what();
  }
  o.offload = offload({"*"}, false, -1);
  EXPECT_THROW(TrainStep(f.model.store(), opt(), f.loss, f.batch_types, o), UserError);
  EXPECT_THROW(parse_memory_kind("hbm"), UserError);

  // An executable that reads an input from pinned_host memory rejects a device array, naming both.
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        Tensor w = to_memory(in[0], MemoryKind::device);
        return std::vector<Tensor>{to_memory(w * 2.0f, MemoryKind::pinned_host)};
      },
      {{DType::f32, {4}}});
  g->mutable_value(g->inputs()[0]).kind = MemoryKind::pinned_host;
  auto exe = Executable::compile(*g, {});
  EXPECT_EQ(exe->input_kind(0), MemoryKind::pinned_host);
  EXPECT_EQ(exe->output_kind(0), MemoryKind::pinned_host);
  Array x = Array::from_f32({1, 2, 3, 4}, {4});
  std::vector<Array> out = {Array(DType::f32, {4}, {0, MemoryKind::pinned_host})};
  try {
    exe->run_into({x}, out);
    FAIL() << "a device array was read as pinned_host";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is in cpu:0/device memory but the program reads it from cpu:0/pinned_host"),
              std::string::npos)
        << e.what();
  }
  exe->run_into({x.to({0, MemoryKind::pinned_host})}, out);
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{2, 4, 6, 8}));
  // run() copies an input to the kind the program reads, for the call.
  out = exe->run({x});
  EXPECT_EQ(out[0].placement().kind, MemoryKind::pinned_host);
  EXPECT_EQ(out[0].to_f32(), (std::vector<float>{2, 4, 6, 8}));
}

}  // namespace
}  // namespace px
