// Pipeline parallelism (TrainStepOptions::pipeline on a mesh with a `stage` axis): every schedule
// trains GPT and Llama to the same losses and params as one device running the same microbatches,
// the memory planned per device from the schedule is what the run holds, and bad settings get
// errors that name the fix.
#include <gtest/gtest.h>
#include <omp.h>

#include <unistd.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "core/env.h"
#include "distributed/threaded.h"
#include "parallax/parallel.h"
#include "parallax/plan.h"
#include "parallax/train.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::opt;

nn::LmConfig gpt4() { return nn::gpt2_config("gpt_pipe", 256, 64, 4, 4, 128, 16); }
nn::LmConfig llama4() { return nn::llama_config("llama_pipe", 256, 64, 4, 2, 4, 96, 16); }

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

struct Trained {
  std::vector<StepMetrics> metrics;
  std::vector<Array> params, state;
};

Trained train(const nn::LmConfig& cfg, TrainStepOptions o, int steps, std::string* report = nullptr) {
  Fixture f(cfg, 8);
  o.clip_norm = 1.0;
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Trained r;
  for (int i = 0; i < steps; ++i) r.metrics.push_back(step(s, f.batch(i)));
  r.params = step.gather_params(s);
  r.state = step.gather_opt_state(s);
  if (report && step.pipelined()) {
    const PipelineReport& p = step.pipeline_report();
    *report = p.to_string();
    for (int d = 0; d < p.schedule.devices; ++d)
      EXPECT_EQ(p.planned_peak(d), p.measured_peak(d)) << "device " << d << "\n" << *report;
  }
  return r;
}

TrainStepOptions pipelined(int devices, int microbatches, pipeline::Kind kind, int virtual_stages = 1) {
  TrainStepOptions o;
  o.mesh = Mesh({{"stage", devices}});
  o.microbatches = microbatches;
  o.pipeline.schedule = kind;
  o.pipeline.virtual_stages = virtual_stages;
  return o;
}

// The same sums in the same order: 1e-6. `sum_order`: sums over rows split across devices (a
// gradient all-reduced over the batch axis) differ in the last bits, which AdamW (eps 1e-5, lr
// 1e-2) carries into the params: the tolerance of the sharded-equality tests (recipe_check.h).
void expect_equal(const Trained& want, const Trained& got, const std::string& what, bool sum_order = false) {
  const double loss_tol = sum_order ? 1e-5 : 1e-6, norm_tol = sum_order ? 1e-4 : 1e-6;
  const double atol = sum_order ? 5e-5 : 1e-6, rtol = sum_order ? 1e-4 : 1e-6;
  ASSERT_EQ(want.metrics.size(), got.metrics.size());
  for (size_t i = 0; i < want.metrics.size(); ++i) {
    EXPECT_NEAR(want.metrics[i].loss, got.metrics[i].loss, loss_tol * std::abs(want.metrics[i].loss))
        << what << " " << i;
    EXPECT_NEAR(want.metrics[i].grad_norm, got.metrics[i].grad_norm, norm_tol * std::abs(want.metrics[i].grad_norm))
        << what << " " << i;
  }
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_TRUE(testing::all_close(got.params[i].to_f32(), want.params[i].to_f32(), atol, rtol))
        << what << " param " << i;
  for (size_t i = 0; i < want.state.size(); ++i)
    EXPECT_TRUE(testing::all_close(got.state[i].to_f32(), want.state[i].to_f32(), atol, 1e-3))
        << what << " state " << i;
}

TEST(Pipeline, EveryScheduleEqualsOneDeviceWithTheSameMicrobatches) {
  for (const nn::LmConfig& cfg : {gpt4(), llama4()}) {
    TrainStepOptions one;
    one.microbatches = 4;
    const Trained want = train(cfg, one, 20);
    for (auto [kind, devices, v] :
         {std::tuple{pipeline::Kind::gpipe, 4, 1}, std::tuple{pipeline::Kind::one_f_one_b, 4, 1},
          std::tuple{pipeline::Kind::interleaved, 2, 2}, std::tuple{pipeline::Kind::zero_bubble, 4, 1}}) {
      std::string report;
      const Trained got = train(cfg, pipelined(devices, 4, kind, v), 20, &report);
      expect_equal(want, got, cfg.name + " " + pipeline::kind_name(kind));
    }
  }
}

// In bf16 the row kernels (norms, the loss) keep rows in per-thread scratch; with four stages each
// stage runs on a thread numbered past the kernels' team, on rows too few to split: each still
// writes scratch of its own (this overran the scratch before), and the step equals one device's.
TEST(Pipeline, Bf16StagesOnMoreThreadsThanTheKernelTeamEqualOneDevice) {
  TrainStepOptions one;
  one.microbatches = 4;
  one.compile.compute_dtype = DType::bf16;
  TrainStepOptions four = pipelined(4, 4, pipeline::Kind::gpipe);
  four.compile.compute_dtype = DType::bf16;
  const Trained want = train(gpt4(), one, 5), got = train(gpt4(), four, 5);
  expect_equal(want, got, "bf16 gpipe", /*sum_order=*/true);
}

// One process running several device groups splits its threads between them: each group's
// kernels are made for its share (their scratch planned for it) and run on it, their parallel
// regions nested inside the group's thread. With 4 OpenMP threads and 2 groups: 2 each.
TEST(Pipeline, EachDeviceGroupRunsOnItsShareOfTheThreads) {
  {  // the mechanism: under a budget, a group's thread starts regions of that many threads
    const int levels = omp_get_max_active_levels();
    omp_set_max_active_levels(2);
    std::vector<int> seen(2, 0);
#pragma omp parallel num_threads(2)
    {
      ThreadBudget budget(3);
      int team = 0;
#pragma omp parallel
      {
#pragma omp single
        team = omp_get_num_threads();
      }
      seen[omp_get_thread_num()] = 10 * team + process_threads();
    }
    omp_set_max_active_levels(levels);
    EXPECT_EQ(seen, (std::vector<int>{33, 33}));
  }
  if (env().num_threads > 0) GTEST_SKIP() << "PX_NUM_THREADS sets every thread's count";
  const int threads = omp_get_max_threads();
  omp_set_num_threads(4);
  TrainStepOptions one;
  one.microbatches = 2;
  std::string report;
  const Trained want = train(gpt4(), one, 3);
  const Trained got = train(gpt4(), pipelined(2, 2, pipeline::Kind::one_f_one_b), 3, &report);
  omp_set_num_threads(threads);
  EXPECT_TRUE(has(report, "2 thread(s) per device group")) << report;
  expect_equal(want, got, "two groups of two threads", /*sum_order=*/true);
}

// 3-D parallelism: stages over `stage`, data, FSDP or tensor parallelism inside each stage. Equal to
// one device and to DDP over the same axis, with the same microbatches, up to the order of the sums
// over rows (each microbatch's gradients are all-reduced in its backward program): 3 steps, as the
// sharded-equality tests, since AdamW carries that noise further every step (plain DDP on data:2
// leaves the tolerance on Llama's embedding after 5).
TEST(Pipeline, StagesWithDataFsdpOrTensorParallelismEqualOneDevice) {
  for (const nn::LmConfig& cfg : {gpt4(), llama4()}) {
    TrainStepOptions one;
    one.microbatches = 2;
    const Trained want = train(cfg, one, 3);
    TrainStepOptions ddp = one;
    ddp.mesh = Mesh({{"data", 2}});
    const Trained ddp_run = train(cfg, ddp, 3);
    for (pipeline::Kind kind : {pipeline::Kind::one_f_one_b, pipeline::Kind::zero_bubble}) {
      TrainStepOptions o = pipelined(2, 2, kind);
      o.mesh = Mesh({{"stage", 2}, {"data", 2}});
      std::string report;
      const Trained got = train(cfg, o, 3, &report);
      const std::string what = cfg.name + " stage:2,data:2 " + pipeline::kind_name(kind);
      expect_equal(want, got, what + " vs one device", /*sum_order=*/true);
      expect_equal(ddp_run, got, what + " vs data:2", /*sum_order=*/true);
    }
    // FSDP, tensor parallelism and AUTO inside the stages: params split by the plan for a stage's
    // devices (AUTO's: its search, on a compute-bound cluster where splitting pays).
    const std::string cluster = testing::compute_bound_cluster();
    for (auto [strategy, axis] : {std::pair{ShardingStrategy::FSDP, "data"}, std::pair{ShardingStrategy::TP, "model"},
                                  std::pair{ShardingStrategy::AUTO, "model"}}) {
      TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
      o.mesh = Mesh({{"stage", 2}, {axis, 2}});
      o.strategy = strategy;
      o.sharding.auto_cluster = cluster;
      std::string report;
      expect_equal(want, train(cfg, o, 3, &report), cfg.name + " stage:2," + axis + ":2 " + strategy_name(strategy),
                   /*sum_order=*/true);
      if (strategy == ShardingStrategy::AUTO) {
        Fixture f(cfg, 8);
        TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
        int split = 0;
        for (const ParamPlacement& p : step.plan().params) split += !p.spec.is_replicated();
        EXPECT_GT(split, 0) << step.table();
      }
    }
    std::remove(cluster.c_str());
  }
}

// balance: a head as costly as several blocks (vocabulary 8192 at d 64) goes to a last stage with
// fewer blocks; the result is still one device's.
TEST(Pipeline, ABalancedSplitGivesTheHeadsStageFewerLayers) {
  const nn::LmConfig heavy_head = nn::gpt2_config("gpt_heavy_head", 8192, 64, 4, 4, 128, 16);
  TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
  o.pipeline.balance = true;
  std::string report;
  TrainStepOptions one;
  one.microbatches = 2;
  expect_equal(train(heavy_head, one, 2), train(heavy_head, o, 2, &report), "balanced");
  EXPECT_TRUE(has(report, "stage 0 (device 0): embed, pos_embed, blocks.0, blocks.1, blocks.2\n")) << report;
  EXPECT_TRUE(has(report, "stage 1 (device 1): blocks.3, final_norm\n")) << report;
  Fixture f(gpt4(), 8);
  o.pipeline.layers_per_stage = {2, 2};
  EXPECT_TRUE(has(testing::user_error_of([&] { TrainStep(f.model.store(), opt(), f.loss, f.batch_types, o); }),
                  "pipeline.balance and pipeline.layers_per_stage are both set"));
}

TEST(Pipeline, FsdpInsideStagesSplitsTheirState) {
  Fixture f(gpt4(), 8);
  auto state_bytes = [&](ShardingStrategy strategy) {
    TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
    o.mesh = Mesh({{"stage", 2}, {"data", 2}});
    o.strategy = strategy;
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
    bool split = false;
    for (const ParamPlacement& p : step.plan().params) split = split || !p.spec.is_replicated();
    EXPECT_EQ(split, strategy == ShardingStrategy::FSDP) << step.table();
    EXPECT_TRUE(has(step.table(), "stage 1 (device group 1)")) << step.table();
    return step.pipeline_report().state_bytes[0];
  };
  EXPECT_LT(state_bytes(ShardingStrategy::FSDP), state_bytes(ShardingStrategy::DDP) * 6 / 10);
}

TEST(Pipeline, OneDeviceStageAxisAndMicrobatchCountsStillEqual) {
  // Uneven layers_per_stage, one microbatch (no sums), and remat inside the stages.
  TrainStepOptions one;
  one.microbatches = 2;
  const Trained want = train(gpt4(), one, 3);
  TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
  o.pipeline.layers_per_stage = {1, 3};
  o.remat.policy = RematPolicy::full;
  std::string report;
  expect_equal(want, train(gpt4(), o, 3, &report), "layers 1+3 with remat");
  EXPECT_TRUE(has(report, "stage 1 (device 1): blocks.1, blocks.2, blocks.3, final_norm")) << report;
  const Trained single = train(gpt4(), {}, 2);
  expect_equal(single, train(gpt4(), pipelined(2, 1, pipeline::Kind::gpipe), 2), "one microbatch");
}

TEST(Pipeline, MemoryPlannedFromTheScheduleGpipeHoldsMoreThan1F1B) {
  Fixture f(gpt4(), 8);
  auto held = [&](pipeline::Kind k) {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, pipelined(4, 8, k));
    TrainState s = step.init(0);
    step(s, f.batch(0));
    const PipelineReport& r = step.pipeline_report();
    for (int d = 0; d < 4; ++d) EXPECT_EQ(r.planned_peak(d), r.measured_peak(d)) << pipeline::kind_name(k) << " " << d;
    EXPECT_EQ(r.timeline.size(), 4u);
    EXPECT_GT(r.schedule_s, 0);
    EXPECT_GE(r.bubble_measured(), 0);
    EXPECT_LT(r.bubble_measured(), 1);
    EXPECT_TRUE(has(r.chrome_trace(), "\"name\":\"F0\"")) << r.chrome_trace().substr(0, 300);
    return r.planned_held_bytes[0];
  };
  // GPipe keeps all 8 microbatches' activations on the first device, 1F1B at most 4.
  EXPECT_GT(held(pipeline::Kind::gpipe), held(pipeline::Kind::one_f_one_b) * 13 / 10);
}

// A device group runs one program at a time, so its programs (forward, backward, update, the
// reduction) run in one arena per device, the size of the largest: what each device allocates
// once the step is built is the report's arenas, not their sum.
TEST(Pipeline, AGroupsProgramsShareOneArena) {
  Fixture f(gpt4(), 8);
  for (pipeline::Kind k : {pipeline::Kind::one_f_one_b, pipeline::Kind::zero_bubble}) {
    std::vector<int64_t> before;
    for (int d = 0; d < 2; ++d) before.push_back(memory_stats({d, MemoryKind::device, "cpu"}).bytes_in_use);
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, pipelined(2, 4, k));
    const PipelineReport& r = step.pipeline_report();
    int64_t sum = 0;
    for (int i = 0; i < step.num_programs(); ++i)
      if (step.program(i).executable().graph().inputs().size() > 0) sum += step.program(i).executable().peak_bytes();
    int64_t arenas = 0;
    for (int d = 0; d < 2; ++d) {
      const int64_t allocated = memory_stats({d, MemoryKind::device, "cpu"}).bytes_in_use - before[d];
      EXPECT_EQ(allocated, r.arena_bytes[d]) << pipeline::kind_name(k) << " device " << d;
      arenas += r.arena_bytes[d];
    }
    EXPECT_LT(arenas, sum * 7 / 10) << pipeline::kind_name(k) << ": the programs' own arenas add up to " << sum;
    TrainState s = step.init(0);
    step(s, f.batch(0));
    step(s, f.batch(1));
    for (int d = 0; d < 2; ++d) EXPECT_EQ(r.planned_peak(d), r.measured_peak(d)) << pipeline::kind_name(k) << " " << d;
  }
}

// Planned from shapes alone (px::plan_pipeline: nothing compiled or allocated) as the built step
// plans it; on a cluster, a predicted step time that the bubble makes longer than its busiest stage.
TEST(Pipeline, PlannedWithoutCompilingAsTheBuiltStepPlans) {
  Fixture f(gpt4(), 8);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, pipelined(4, 4, pipeline::Kind::one_f_one_b));
  StepSetup setup;
  setup.batch = 8;
  setup.optimizer = opt();
  setup.microbatches = 4;
  PipelineOptions po;
  const Cluster cluster = cluster_preset("h100x8");
  const Mesh mesh = cluster.apply(Mesh({{"stage", 4}}));
  const PipelineReport planned = plan_pipeline(gpt4(), mesh, ShardingStrategy::DDP, setup, po, &cluster);
  const PipelineReport& built = step.pipeline_report();
  for (int d = 0; d < 4; ++d) {
    EXPECT_EQ(planned.state_bytes[d], built.state_bytes[d]) << d;
    EXPECT_EQ(planned.planned_held_bytes[d], built.planned_held_bytes[d]) << d;
    EXPECT_EQ(planned.planned_peak(d), built.planned_peak(d)) << d << "\n" << planned.to_string() << built.to_string();
  }
  EXPECT_GT(planned.predicted_step_s, planned.predicted_schedule_s);
  EXPECT_GT(planned.predicted_bubble, 0);
  EXPECT_LT(planned.predicted_bubble, 1);
  EXPECT_TRUE(has(planned.to_string(), "predicted: step")) << planned.to_string();
  // Its compiled programs: each stage's forward, backward and update, each a sharded executable.
  ASSERT_GE(step.num_programs(), 3 * 4);
  for (int i = 0; i < step.num_programs(); ++i) EXPECT_GT(step.program(i).executable().num_steps(), 0) << i;
  EXPECT_EQ(&step.executable(), &step.program(0).executable());
  EXPECT_TRUE(has(testing::user_error_of([&] { step.program(step.num_programs()); }), "is not one of the step's"));
}

// What a device group holds is its stages' share, planned from shapes (px::plan_pipeline).
StepSetup small_setup(int64_t batch, int microbatches) {
  StepSetup setup;
  setup.batch = batch;
  setup.optimizer = opt();
  setup.microbatches = microbatches;
  return setup;
}

// Each param is read (held, with its optimizer state) by the device group of its layer's stage
// only, the tied embedding by the first and the last: a layer's backward pass runs on its stage,
// its input gradient received from the next one.
TEST(Pipeline, EachParamIsHeldByItsStageOnly) {
  const nn::LmConfig cfg = gpt4();
  nn::TransformerLm model(cfg);
  int64_t params = 0;
  for (const TensorType& t : model.store().types()) params += t.nbytes();
  const int64_t table = cfg.vocab_size * cfg.d_model * 4;
  for (pipeline::Kind kind : {pipeline::Kind::one_f_one_b, pipeline::Kind::zero_bubble}) {
    PipelineOptions po;
    po.schedule = kind;
    const PipelineReport r = plan_pipeline(cfg, Mesh({{"stage", 4}}), ShardingStrategy::DDP, small_setup(8, 4), po);
    int64_t held = 0;
    for (int64_t b : r.param_bytes) held += b;
    EXPECT_EQ(held, params + table) << pipeline::kind_name(kind) << "\n" << r.to_string();
  }
}

// FSDP inside the stages gathers a param where it is read: the activations stay split by the batch,
// so the messages and what a device holds are no more than DDP's, even where a param splits on
// another dim (GPT-3's padded vocabulary of 50304 does not split over 256 devices: the table splits
// on its features). Planned from shapes: GPT-3 175B's layer sizes, two layers.
TEST(Pipeline, FsdpInsideStagesKeepsActivationsSplitByTheBatch) {
  const nn::LmConfig wide = nn::gpt2_config("gpt3_175b_2_layers", 50304, 12288, 96, 2, 49152, 256);
  const Mesh mesh({{"stage", 2}, {"data", 256}});
  const PipelineReport ddp = plan_pipeline(wide, mesh, ShardingStrategy::DDP, small_setup(512, 2), {});
  const PipelineReport fsdp = plan_pipeline(wide, mesh, ShardingStrategy::FSDP, small_setup(512, 2), {});
  EXPECT_LE(fsdp.message_bytes, ddp.message_bytes) << fsdp.to_string() << ddp.to_string();
  for (int d = 0; d < 2; ++d)
    EXPECT_LE(fsdp.planned_held_bytes[d], ddp.planned_held_bytes[d]) << fsdp.to_string() << ddp.to_string();
}

// Tensor parallelism inside the stages: an activation the group holds whole on `model` is sent
// split over it (each device its slice, gathered on arrival), so two devices per stage send about
// the bytes one device per stage does (scalars, such as the clipping norm's parts, go whole), not
// twice them.
TEST(Pipeline, TensorParallelStagesSendActivationsSplit) {
  const PipelineReport one = plan_pipeline(gpt4(), Mesh({{"stage", 2}}), ShardingStrategy::DDP, small_setup(8, 2), {});
  const PipelineReport tp =
      plan_pipeline(gpt4(), Mesh({{"stage", 2}, {"model", 2}}), ShardingStrategy::TP, small_setup(8, 2), {});
  EXPECT_LT(tp.message_bytes, one.message_bytes * 11 / 10) << tp.to_string() << one.to_string();
  EXPECT_EQ(tp.messages, 2 * one.messages) << tp.to_string() << one.to_string();
}

// 1F1B holds at most S microbatches on a device whatever their count: with the same rows per
// microbatch, 2 and 8 microbatches hold the same bytes (DDP inside: each microbatch's gradients are
// freed once added to the sums that are reduced once a step).
TEST(Pipeline, OneFOneBHoldsTheSameForMoreMicrobatches) {
  const Mesh mesh({{"stage", 2}, {"data", 2}});
  for (ShardingStrategy strategy : {ShardingStrategy::DDP, ShardingStrategy::FSDP}) {
    const PipelineReport two = plan_pipeline(gpt4(), mesh, strategy, small_setup(8, 2), {});
    const PipelineReport eight = plan_pipeline(gpt4(), mesh, strategy, small_setup(32, 8), {});
    for (int d = 0; d < 2; ++d)
      EXPECT_EQ(two.planned_held_bytes[d], eight.planned_held_bytes[d])
          << strategy_name(strategy) << " device " << d << "\n"
          << two.to_string() << eight.to_string();
  }
}

// AUTO with auto_pipeline: on slow devices in nodes of 2 joined by a slower link, the 4 devices
// train fastest as 2 stages of 2 (the stages across the link, the work of a stage split inside a
// node: only activations cross the link; without stages the batch split all-reduces every
// gradient across it): AUTO trains that, equal to one device with the microbatches it chose, and
// says why.
TEST(Pipeline, AutoTrainsAPipelineWhenItIsPredictedFaster) {
  const std::string cluster = ::testing::TempDir() + "/slow_nodes_" + std::to_string(::getpid()) + ".toml";
  std::ofstream(cluster) << R"(name = "slow_nodes"
devices_per_node = 2
[device]
matmul_flops_f32 = 1e9
vector_flops = 1e9
memory_bandwidth = 1e10
memory_bytes = 1e12
[intra_node]
bandwidth_bytes_per_s = 1e12
latency_s = 1e-9
[inter_node]
bandwidth_bytes_per_s = 1e7
latency_s = 1e-4
)";
  TrainStepOptions o;
  o.mesh = Mesh({{"data", 4}});
  o.strategy = ShardingStrategy::AUTO;
  o.sharding.auto_cluster = cluster;
  o.sharding.auto_pipeline = true;
  o.sharding.auto_time_limit_s = 5;
  Fixture f(gpt4(), 8);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  ASSERT_TRUE(step.pipelined()) << step.plan().explanation;
  // Two stages, across the slow link; inside each node the devices split the stage's work.
  EXPECT_TRUE(has(step.plan().explanation, "AUTO: pipelined on Mesh{stage: 2, ")) << step.plan().explanation;
  EXPECT_TRUE(has(step.plan().explanation, "predicted bubble")) << step.plan().explanation;
  EXPECT_TRUE(has(step.plan().explanation, "stage 1 (device group 1): blocks.2, blocks.3, final_norm"))
      << step.plan().explanation;
  TrainStepOptions one;
  one.microbatches = step.pipeline_report().schedule.microbatches;
  const Trained want = train(gpt4(), one, 3);
  TrainState s = step.init(0);
  Trained got;
  for (int i = 0; i < 3; ++i) got.metrics.push_back(step(s, f.batch(i)));
  got.params = step.gather_params(s);
  got.state = step.gather_opt_state(s);
  // train() clips at 1; this step does not: the first step's loss (before any update) is the same,
  // the later ones differ by the clipping.
  EXPECT_NEAR(want.metrics[0].loss, got.metrics[0].loss, 1e-5 * std::abs(want.metrics[0].loss));
  // With rules (which name the mesh's axes), or without auto_pipeline, AUTO plans the mesh as given.
  o.sharding.rules = {{"embed.table", PartitionSpec()}};
  EXPECT_FALSE(TrainStep(f.model.store(), opt(), f.loss, f.batch_types, o).pipelined());
  o.sharding.rules.clear();
  o.sharding.auto_pipeline = false;
  TrainStep flat(f.model.store(), opt(), f.loss, f.batch_types, o);
  EXPECT_FALSE(flat.pipelined());
  std::remove(cluster.c_str());
}

// The AUTO matrix's large row (bench/plan --matrix --model=175b: GPT-3 175B over 128 nodes of 8
// GPUs joined by 100 Gb/s Ethernet), at a size CI plans in seconds: 24 of GPT-3's layers over 32
// such nodes are predicted fastest pipelined (the stages cross the slow link, tensor parallelism
// stays in a node), and AUTO with pipelining (px::search_pipelines beside px::plan_auto) picks it.
TEST(Pipeline, OnASlowLinkGpt3LayersArePredictedFastestPipelined) {
  const nn::LmConfig gpt3 = nn::gpt2_config("gpt3_24_layers", 50304, 12288, 96, 24, 49152, 2048);
  StepSetup setup;
  setup.batch = 512;
  setup.seq = 2048;
  setup.compute_dtype = DType::bf16;
  setup.remat.policy = RematPolicy::full;
  Cluster cluster = cluster_preset("h100x8");
  cluster.inter_node = {12.5e9 / 8 * 0.9, 10e-6};
  const Mesh mesh = cluster.apply(Mesh({{"data", 32}, {"model", 8}}));
  const AutoPlan flat = plan_auto(gpt3, mesh, cluster, setup);
  ASSERT_TRUE(flat.fits) << flat.why;
  const std::vector<PipelineCandidate> piped = search_pipelines(gpt3, 256, cluster, setup);
  ASSERT_FALSE(piped.empty());
  ASSERT_TRUE(piped[0].fits) << piped[0].report.to_string();
  EXPECT_LT(piped[0].report.predicted_step_s, flat.cost.step_s) << piped[0].report.to_string() << flat.explain();
  EXPECT_TRUE(has(piped[0].mesh.to_string(), "model: 8")) << piped[0].mesh.to_string();
}

// Stages in two processes (a threaded world: each process a thread with its own communicator, as
// under mpirun) of stage:2,data:2, one stage of 2 devices each: activations and gradients cross
// as point-to-point messages, the loss, norm and the tied embedding reach both, and the state each
// process gathers or saves (the first process writes it, fetched from the stage updating it)
// equals the pipeline in one process bitwise. Over MPI: MpiRanks.PipelineOverProcesses*.
void check_two_processes(const std::string& axis, ShardingStrategy strategy) {
  TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
  o.mesh = Mesh({{"stage", 2}, {axis, 2}});
  o.strategy = strategy;
  const Trained want = train(gpt4(), o, 3);
  const Mesh split = o.mesh->with_processes(2);
  const std::string dir = ::testing::TempDir() + "/px_pipeline_procs_" + axis + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const std::string what = std::string(strategy_name(strategy)) + " on " + split.to_string();
  std::vector<Trained> got(2);
  std::vector<std::vector<Array>> loaded(2);
  auto world = make_threaded_world(split.process_layout());
  world->run([&](int p, Communicator& comm) {
    Fixture f(gpt4(), 8);
    TrainStepOptions po = o;
    po.mesh = split;
    po.clip_norm = 1.0;
    po.sharding.communicator = &comm;
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, po);
    TrainState s = step.init(0);
    for (int i = 0; i < 3; ++i) got[p].metrics.push_back(step(s, f.batch(i)));
    got[p].params = step.gather_params(s);
    got[p].state = step.gather_opt_state(s);
    step.save(dir, s);
    loaded[p] = step.gather_params(step.load(dir));
  });
  for (int p = 0; p < 2; ++p) {
    for (size_t i = 0; i < want.metrics.size(); ++i) {
      EXPECT_EQ(got[p].metrics[i].loss, want.metrics[i].loss) << what << " process " << p << " step " << i;
      EXPECT_EQ(got[p].metrics[i].grad_norm, want.metrics[i].grad_norm) << what << " process " << p << " step " << i;
    }
    for (size_t i = 0; i < want.params.size(); ++i) {
      EXPECT_EQ(got[p].params[i].to_f32(), want.params[i].to_f32()) << what << " process " << p << " param " << i;
      EXPECT_EQ(loaded[p][i].to_f32(), want.params[i].to_f32()) << what << " process " << p << " loaded param " << i;
    }
    for (size_t i = 0; i < want.state.size(); ++i)
      EXPECT_EQ(got[p].state[i].to_f32(), want.state[i].to_f32()) << what << " process " << p << " state " << i;
  }
  std::filesystem::remove_all(dir);
}

TEST(Pipeline, StagesInTwoProcessesEqualOneProcessBitwise) {
  check_two_processes("data", ShardingStrategy::DDP);
  check_two_processes("model", ShardingStrategy::TP);  // activations sent split over `model`
  // A device group split over processes is refused, naming the fix.
  TrainStepOptions o = pipelined(2, 2, pipeline::Kind::one_f_one_b);
  const Mesh across = Mesh({{"data", 2}, {"stage", 2}}).with_processes(2);
  auto world2 = make_threaded_world(across.process_layout());
  std::vector<std::string> errors(2);
  world2->run([&](int p, Communicator& comm) {
    Fixture f(gpt4(), 8);
    TrainStepOptions po = o;
    po.mesh = across;
    po.sharding.communicator = &comm;
    errors[p] = testing::user_error_of([&] { TrainStep(f.model.store(), opt(), f.loss, f.batch_types, po); });
  });
  for (const std::string& e : errors) EXPECT_TRUE(has(e, "put the `stage` axis first")) << e;
}

int64_t pipelined_peak(const TrainStepOptions& o) {
  Fixture f(gpt4(), 8);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  return step.peak_bytes();
}

// Remat inside the stages, `auto` included: the least recompute whose busiest device group fits
// the budget (its held microbatches counted from the schedule), the same bits as without remat.
TEST(Pipeline, RematAutoFitsTheBudgetWithTheSameBits) {
  const TrainStepOptions none = pipelined(2, 4, pipeline::Kind::gpipe);
  TrainStepOptions full = none;
  full.remat.policy = RematPolicy::full;
  const int64_t p_none = pipelined_peak(none), p_full = pipelined_peak(full);
  ASSERT_LT(p_full, p_none);
  TrainStepOptions a = none;
  a.remat = {RematPolicy::automatic, {}, -1, p_none - 1};
  EXPECT_LE(pipelined_peak(a), p_none - 1);
  EXPECT_GE(pipelined_peak(a), p_full);
  const Trained want = train(gpt4(), none, 3);
  for (const TrainStepOptions& o : {full, a}) {
    std::string report;
    const Trained got = train(gpt4(), o, 3, &report);
    for (size_t i = 0; i < want.metrics.size(); ++i) EXPECT_EQ(want.metrics[i].loss, got.metrics[i].loss) << i;
    for (size_t i = 0; i < want.params.size(); ++i)
      EXPECT_TRUE(recipe_check::bitwise_equal(want.params[i], got.params[i])) << remat_policy_name(o.remat.policy)
                                                                              << " param " << i;
  }
  TrainStepOptions tight = none;
  tight.remat = {RematPolicy::automatic, {}, -1, 1 << 10};
  Fixture f(gpt4(), 8);
  EXPECT_TRUE(has(testing::user_error_of([&] { TrainStep(f.model.store(), opt(), f.loss, f.batch_types, tight); }),
                  "no policy fits the budget"));
}

// Offload inside the stages: each stage's params (and optimizer state) live in pinned_host memory
// and are fetched ahead of use in its forward and backward programs; the update runs where the
// state lives. The same bits as without offload, a lower planned peak on every device group, and
// the planned peak is what the run holds.
TEST(Pipeline, OffloadKeepsTheBitsAndLowersThePlannedPeak) {
  for (const Mesh& mesh : {Mesh({{"stage", 2}}), Mesh({{"stage", 2}, {"data", 2}})}) {
    TrainStepOptions none = pipelined(2, 4, pipeline::Kind::one_f_one_b);
    none.mesh = mesh;
    none.strategy = ShardingStrategy::FSDP;
    TrainStepOptions params = none, all = none;
    params.offload.params = {"blocks.*"};
    params.offload.prefetch_depth = 0;
    all.offload.params = {"*"};
    all.offload.optimizer_state = true;
    const int64_t p_none = pipelined_peak(none), p_params = pipelined_peak(params), p_all = pipelined_peak(all);
    std::cout << mesh.to_string() << ": planned peak " << p_none << " bytes, " << p_params
              << " with the blocks' params offloaded, " << p_all << " with every param and the optimizer state\n";
    // The params and their optimizer state leave every device group. (The params alone do not
    // lower it on this model: the update program's arena then holds the decomposed update's
    // steps, and a device's programs each have their own arena; docs/pipeline.md.)
    EXPECT_LT(p_all, p_none * 7 / 10) << mesh.to_string();
    const Trained want = train(gpt4(), none, 3);
    for (const TrainStepOptions& o : {params, all}) {
      std::string report;
      const Trained got = train(gpt4(), o, 3, &report);
      for (size_t i = 0; i < want.metrics.size(); ++i) EXPECT_EQ(want.metrics[i].loss, got.metrics[i].loss) << i;
      for (size_t i = 0; i < want.params.size(); ++i)
        EXPECT_TRUE(recipe_check::bitwise_equal(want.params[i], got.params[i])) << mesh.to_string() << " param " << i;
      for (size_t i = 0; i < want.state.size(); ++i)
        EXPECT_TRUE(recipe_check::bitwise_equal(want.state[i], got.state[i])) << mesh.to_string() << " state " << i;
    }
  }
}

TEST(Pipeline, BadSettingsNameTheFix) {
  Fixture f(gpt4(), 8);
  auto make = [&](TrainStepOptions o, Fixture& fx) {
    return testing::user_error_of([&] { TrainStep(fx.model.store(), opt(), fx.loss, fx.batch_types, o); });
  };
  std::string e = make(pipelined(3, 4, pipeline::Kind::one_f_one_b), f);
  EXPECT_TRUE(has(e, "4 numbered layers do not split evenly into 3 stages") && has(e, "layers_per_stage")) << e;
  e = make(pipelined(4, 4, pipeline::Kind::interleaved, 2), f);
  EXPECT_TRUE(has(e, "8 stages but the model has 4 numbered layers")) << e;
  e = make(pipelined(2, 3, pipeline::Kind::one_f_one_b), f);
  EXPECT_TRUE(has(e, "microbatches = 3 does not divide")) << e;
  TrainStepOptions bad_split = pipelined(2, 2, pipeline::Kind::gpipe);
  bad_split.pipeline.layers_per_stage = {1, 2};
  e = make(bad_split, f);
  EXPECT_TRUE(has(e, "layers_per_stage [1, 2] does not fit")) << e;
  TrainStepOptions rows = pipelined(2, 8, pipeline::Kind::gpipe);
  rows.mesh = Mesh({{"stage", 2}, {"data", 2}});
  e = make(rows, f);
  EXPECT_TRUE(has(e, "microbatches = 8 does not divide the rows of batch array 0")) << e;
  // A model without numbered layers.
  nn::Scope root;
  nn::Param w = root.sub("proj").param("w", {DType::f32, {4, 4}}, nn::Init{.kind = nn::Init::Kind::ones});
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return mean(matmul(b[0], w)); };
  e = testing::user_error_of([&] {
    TrainStep(root.store(), opt(), loss, {{DType::f32, {4, 4}}}, pipelined(2, 2, pipeline::Kind::gpipe));
  });
  EXPECT_TRUE(has(e, "no layer boundaries")) << e;
  // Not pipelined: a pipeline of one stage, its one program the whole step, planned as the step.
  TrainStep plain(f.model.store(), opt(), f.loss, f.batch_types);
  EXPECT_FALSE(plain.pipelined());
  EXPECT_EQ(plain.pipeline_report().schedule.stages(), 1);
  EXPECT_EQ(plain.num_programs(), 1);
  EXPECT_EQ(plain.pipeline_report().planned_peak(0), plain.executable().memory().peak_bytes);
  EXPECT_EQ(plain.peak_bytes(), plain.executable().memory().peak_bytes);
}

}  // namespace
}  // namespace px
