// Gradient accumulation (TrainStepOptions::microbatches): the step runs its batch as m
// microbatches, forward and backward in turn, and applies one update. The result equals the
// unsplit step up to summation order, on one device and on every strategy, its planned peak falls
// with m, and each device's microbatch is a slice of its own rows (no batch collective).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "../sharding/recipe_check.h"
#include "memory/step_program.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "parallax/train.h"
#include "train/steps.h"

namespace px {
namespace {

using recipe_check::Fixture;
using recipe_check::gpt_micro;
using recipe_check::opt;

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

constexpr int kSteps = 3;

struct Outcome {
  std::vector<StepMetrics> metrics;
  std::vector<Array> params;
  int64_t peak = 0;
  int64_t measured = 0;  // one device: the allocator's high-water mark over the first step
  MemoryReport memory;
  std::vector<CollectiveRecord> collectives;
};

Outcome train(TrainStepOptions o, int64_t batch = 8, const nn::LmConfig& cfg = gpt_micro()) {
  Fixture f(cfg, batch);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o);
  TrainState s = step.init(0);
  Outcome r;
  r.metrics.push_back(step(s, f.batch(0)));  // allocates the metrics' arrays that later steps reuse
  // The second step's high-water mark above what the rest of the process holds.
  const Placement dev{0};
  const std::vector<Array> second = f.batch(1);
  const int64_t base = memory_stats(dev).bytes_in_use - step.executable().memory().peak_bytes;
  reset_peak_memory(dev);
  r.metrics.push_back(step(s, second));
  r.measured = memory_stats(dev).peak_bytes_in_use - base;
  for (int i = 2; i < kSteps; ++i) r.metrics.push_back(step(s, f.batch(i)));
  r.params = step.gather_params(s);
  r.peak = step.peak_bytes();
  r.memory = step.executable().memory();
  r.collectives = step.program().program().collectives;
  return r;
}

// Equal up to summation order: the microbatch gradients are summed in another order than the
// rows of the whole batch (f32), so losses and norms agree to ~1e-6 and params after 3 AdamW
// steps to the tolerance the sharded-equivalence tests use for the same reason.
void expect_close(const Outcome& want, const Outcome& got, const std::string& what) {
  ASSERT_EQ(want.metrics.size(), got.metrics.size());
  for (size_t i = 0; i < want.metrics.size(); ++i) {
    EXPECT_NEAR(want.metrics[i].loss, got.metrics[i].loss, 1e-5 * std::abs(want.metrics[i].loss)) << what << " " << i;
    EXPECT_NEAR(want.metrics[i].grad_norm, got.metrics[i].grad_norm, 1e-4 * std::abs(want.metrics[i].grad_norm))
        << what << " " << i;
  }
  ASSERT_EQ(want.params.size(), got.params.size());
  for (size_t i = 0; i < want.params.size(); ++i)
    EXPECT_TRUE(testing::all_close(got.params[i].to_f32(), want.params[i].to_f32(), 5e-5, 1e-4))
        << what << " param " << i;
}

// Collectives of a kind over arrays (not scalars: each microbatch's loss reduces its own token count).
int count(const std::vector<CollectiveRecord>& cs, CollectiveKind kind) {
  int n = 0;
  for (const CollectiveRecord& c : cs) n += c.kind == kind && c.operand.rank() > 0;
  return n;
}

// Bytes of the batch (i32 token ids) that collectives move per device and step. Slicing a
// microbatch moves none: each device's microbatch is made of its own rows.
int64_t batch_collective_bytes(const Outcome& r) {
  int64_t n = 0;
  for (const CollectiveRecord& c : r.collectives)
    if (!c.local_slice() && c.operand.dtype == DType::i32) n += c.operand.nbytes();
  return n;
}
void expect_no_batch_collective(const Outcome& r, const std::string& what) {
  EXPECT_EQ(batch_collective_bytes(r), 0) << what;
}

TEST(Microbatches, OneDeviceEqualsTheWholeBatch) {
  const Outcome whole = train({});
  for (int m : {2, 4}) {
    const Outcome split = train({.microbatches = m});
    expect_close(whole, split, "one device, microbatches " + std::to_string(m));
  }
  // microbatches = 1 is the unsplit step itself.
  const Outcome one = train({.microbatches = 1});
  for (size_t i = 0; i < whole.params.size(); ++i)
    EXPECT_TRUE(recipe_check::bitwise_equal(whole.params[i], one.params[i])) << i;
}

TEST(Microbatches, DdpReducesOnceAndSlicesItsOwnRows) {
  const Outcome whole = train({});
  const Mesh mesh = Mesh::cpu({{"data", 2}});
  const Outcome ddp1 = train(testing::on_mesh(mesh, ShardingStrategy::DDP));
  for (int m : {2, 4}) {
    const std::string what = "DDP cpu:2, microbatches " + std::to_string(m);
    const Outcome ddp = train(testing::on_mesh(mesh, ShardingStrategy::DDP, {}, {.microbatches = m}));
    expect_close(whole, ddp, what);
    expect_no_batch_collective(ddp, what);
    // The microbatch gradients are summed as partial sums and all-reduced once.
    EXPECT_EQ(count(ddp.collectives, CollectiveKind::all_reduce), count(ddp1.collectives, CollectiveKind::all_reduce)) << what;
    EXPECT_EQ(count(ddp.collectives, CollectiveKind::all_gather), 0) << what;
  }
  // Gradients reduced in buckets (DDP over a slow link): the summed gradients, once.
  const Outcome bucketed =
      train(testing::on_mesh(mesh, ShardingStrategy::DDP, {.bucket_bytes = 1 << 16}, {.microbatches = 2}));
  expect_close(whole, bucketed, "DDP cpu:2 with buckets, microbatches 2");
  const Outcome bucketed1 = train(testing::on_mesh(mesh, ShardingStrategy::DDP, {.bucket_bytes = 1 << 16}));
  EXPECT_EQ(count(bucketed.collectives, CollectiveKind::all_reduce), count(bucketed1.collectives, CollectiveKind::all_reduce));
  EXPECT_LT(count(bucketed.collectives, CollectiveKind::all_reduce), count(ddp1.collectives, CollectiveKind::all_reduce));
}

// 32 sequences: each microbatch's activations outweigh the weights, so its weight gradients are
// computed from its own rows as partial sums (with fewer rows than weights, the FSDP recipe splits
// a weight gradient's matmul over the weight instead, as it would for so small a batch unsplit).
TEST(Microbatches, FsdpGathersPerMicrobatchAndSumsShards) {
  const int64_t batch = 32;
  const Outcome whole = train({}, batch);
  const Mesh mesh = Mesh::cpu({{"data", 2}});
  const ShardingOptions small{.fsdp_min_bytes = 1024};
  const Outcome fsdp1 = train(testing::on_mesh(mesh, ShardingStrategy::FSDP, small), batch);
  ASSERT_GT(count(fsdp1.collectives, CollectiveKind::all_gather), 0);
  for (int m : {2, 4}) {
    const std::string what = "FSDP cpu:2, microbatches " + std::to_string(m);
    const Outcome fsdp = train(testing::on_mesh(mesh, ShardingStrategy::FSDP, small, {.microbatches = m}), batch);
    expect_close(whole, fsdp, what);
    expect_no_batch_collective(fsdp, what);
    // ZeRO-3 per microbatch: each split param gathered for its forward and backward passes, each
    // microbatch's gradient reduce-scattered and summed in shards.
    EXPECT_EQ(count(fsdp.collectives, CollectiveKind::all_gather), m * count(fsdp1.collectives, CollectiveKind::all_gather)) << what;
    EXPECT_EQ(count(fsdp.collectives, CollectiveKind::reduce_scatter), m * count(fsdp1.collectives, CollectiveKind::reduce_scatter)) << what;
    EXPECT_EQ(count(fsdp.collectives, CollectiveKind::all_to_all), 0) << what;
  }
}

TEST(Microbatches, AutoEqualsTheWholeBatch) {
  const Outcome whole = train({});
  const Outcome a = train(testing::on_mesh(Mesh::cpu({{"data", 2}}), ShardingStrategy::AUTO, {}, {.microbatches = 2}));
  expect_close(whole, a, "AUTO cpu:2, microbatches 2");
  expect_no_batch_collective(a, "AUTO cpu:2, microbatches 2");
}

// Activations dominate (32 sequences of a small model): one microbatch's are alive at a time.
TEST(Microbatches, PlannedPeakFallsWithTheMicrobatchCount) {
  const nn::LmConfig cfg = gpt_micro();
  const Outcome m1 = train({}, 32, cfg), m4 = train({.microbatches = 4}, 32, cfg);
  const auto acts = [](const Outcome& r) {
    return r.memory.arena_max_by_category[static_cast<int>(MemoryCategory::activations)];
  };
  EXPECT_LT(m4.peak, m1.peak);
  // Measured as planned, up to what the plan leaves out the same way for both: the run's copy of
  // the caller's batch (2 x i32[32, 16]) and the step counter.
  const int64_t batch_bytes = 2 * 32 * cfg.max_seq_len * 4;
  EXPECT_EQ(m4.measured - m4.peak, m1.measured - m1.peak);
  EXPECT_GE(m4.measured, m4.peak);
  EXPECT_LE(m4.measured, m4.peak + batch_bytes + 64);
  // The floor (what must be alive together in any order) is a lower bound of the peak.
  EXPECT_LE(m4.memory.floor_bytes, m4.peak);
  EXPECT_GT(m4.memory.floor_bytes, m4.memory.input_bytes);
  EXPECT_LT(2 * acts(m4), acts(m1)) << m1.memory.to_string() << "\n" << m4.memory.to_string();
  // Over a memory limit, the error lists the microbatch counts that would fit.
  Fixture f(cfg, 32);
  TrainStepOptions limited;
  limited.compile.memory_limit_bytes = m4.peak;
  const std::string e = testing::user_error_of([&] { TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, limited); });
  EXPECT_TRUE(has(e, "microbatches 4: " + std::to_string(m4.peak) + " bytes (fits)")) << e;
  EXPECT_TRUE(has(e, "microbatches 2: ")) << e;
  std::cout << "planned peak per device, gpt_micro batch 32: microbatches 1: " << m1.peak
            << " bytes, microbatches 4: " << m4.peak << " bytes\n";
}

// Remat rewrites each microbatch's backward pass on its own: bitwise the same results.
TEST(Microbatches, RematPoliciesApplyPerMicrobatch) {
  const int64_t batch = 32;  // activations dominate, so that remat lowers the peak
  const Outcome plain = train({.microbatches = 2}, batch);
  for (RematPolicy p :
       {RematPolicy::full, RematPolicy::dots_saveable, RematPolicy::nothing_saveable, RematPolicy::offload}) {
    const Outcome r = train({.microbatches = 2, .remat = {p, {}}}, batch);
    for (size_t i = 0; i < plain.params.size(); ++i)
      EXPECT_TRUE(recipe_check::bitwise_equal(plain.params[i], r.params[i])) << remat_policy_name(p) << " " << i;
    EXPECT_LT(r.peak, plain.peak) << remat_policy_name(p);
  }
  // auto: the least recompute that fits a budget below the plain peak.
  const Outcome a = train({.microbatches = 2, .remat = {RematPolicy::automatic, {}, -1, plain.peak - 1}}, batch);
  EXPECT_LT(a.peak, plain.peak);
  for (size_t i = 0; i < plain.params.size(); ++i)
    EXPECT_TRUE(recipe_check::bitwise_equal(plain.params[i], a.params[i])) << "auto " << i;
}

// Params and optimizer state offloaded: the same bits, a lower device peak.
TEST(Microbatches, OffloadAppliesToEveryMicrobatch) {
  const Outcome plain = train({.microbatches = 2});
  const Outcome off = train({.microbatches = 2, .offload = {.params = {"*"}, .optimizer_state = true}});
  for (size_t i = 0; i < plain.params.size(); ++i)
    EXPECT_TRUE(recipe_check::bitwise_equal(plain.params[i], off.params[i])) << i;
  EXPECT_LT(off.peak, plain.peak);
}

// Tensor parallelism within each microbatch, data parallelism over the rows.
TEST(Microbatches, FsdpTpEqualsTheWholeBatch) {
  const Outcome whole = train({});
  const Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 2}});
  const Outcome tp1 = train(testing::on_mesh(mesh, ShardingStrategy::FSDP_TP, {.fsdp_min_bytes = 1024}));
  const Outcome tp =
      train(testing::on_mesh(mesh, ShardingStrategy::FSDP_TP, {.fsdp_min_bytes = 1024}, {.microbatches = 2}));
  expect_close(whole, tp, "FSDP_TP data:2,model:2, microbatches 2");
  // The recipe gathers the token ids for the data-split embedding's gradient; with microbatches,
  // each microbatch's, and nothing more.
  EXPECT_EQ(batch_collective_bytes(tp), batch_collective_bytes(tp1));
}

// Which microbatch's forward or backward pass a node belongs to, and which value is which param's
// gradient, are facts on the program that every pass carries: after remat and offload each node
// still says where it runs (a recomputed copy and a fetch run in the backward pass of the
// microbatch that reads them) and each param still has one gradient of the step and one per
// microbatch; the dump prints them.
TEST(Microbatches, ThePassesCarryEachNodesPhaseAndEachGradient) {
  Fixture f(gpt_micro(), 8);
  const StepProgram traced = trace_train_step(f.model.store(), *opt(), f.loss, f.batch_types, 0, "test", false, 2);
  ASSERT_EQ(traced.microbatches, 2);
  auto check = [](const StepProgram& p, const std::string& what) {
    const auto& nodes = p.graph->nodes();
    int last_forward[2] = {-1, -1}, first_backward[2] = {1 << 30, 1 << 30}, updates = 0;
    for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
      const NodeFacts& at = nodes[i].facts;
      ASSERT_NE(at.phase, StepPhase::none) << what << ": node " << i << " has no phase";
      if (at.phase == StepPhase::update) {
        EXPECT_EQ(at.microbatch, -1) << what;
        ++updates;
        continue;
      }
      ASSERT_TRUE(at.microbatch == 0 || at.microbatch == 1) << what << ": node " << i;
      if (at.phase == StepPhase::forward) last_forward[at.microbatch] = i;
      else first_backward[at.microbatch] = std::min(first_backward[at.microbatch], i);
      if (nodes[i].attrs.has("remat")) EXPECT_EQ(at.phase, StepPhase::backward) << what << ": a recomputed copy";
    }
    EXPECT_GT(updates, 0) << what;
    // Microbatch 0's forward, its backward, then microbatch 1's forward and backward.
    EXPECT_LT(last_forward[0], first_backward[0]) << what;
    EXPECT_LT(first_backward[0], last_forward[1]) << what;
    EXPECT_LT(last_forward[1], first_backward[1]) << what;
    std::set<int> seen;
    for (const std::vector<int>& gs : {p.grads(), p.micro_grads(0), p.micro_grads(1)}) {
      ASSERT_EQ(gs.size(), p.n_params) << what;
      for (size_t i = 0; i < gs.size(); ++i) {
        EXPECT_TRUE(seen.insert(gs[i]).second) << what << ": value %" << gs[i] << " is two gradients";
        EXPECT_EQ(p.graph->values()[gs[i]].category, MemoryCategory::gradients) << what;
        EXPECT_EQ(p.graph->type(gs[i]), p.graph->type(p.graph->inputs()[i])) << what;
      }
    }
  };
  check(traced, "traced");
  const std::string dump = traced.graph->to_string();
  EXPECT_TRUE(has(dump, "# forward 0") && has(dump, "# backward 1") && has(dump, "# update")) << "the dump";
  EXPECT_TRUE(has(dump, "gradient of input 0")) << "the dump";
  const StepProgram remat = remat_step(traced.clone(), {RematPolicy::nothing_saveable, {}});
  ASSERT_GT(remat.graph->nodes().size(), traced.graph->nodes().size());
  check(remat, "remat nothing_saveable");
  const StepProgram offloaded = offload_step(remat.clone(), {.params = {"*"}});
  ASSERT_GT(offloaded.graph->nodes().size(), remat.graph->nodes().size());
  check(offloaded, "remat and the params offloaded");
}

// A loss that adds two params directly: autodiff gives both the same cotangent, and the trace
// makes each param's gradient a value of its own.
TEST(Microbatches, TwoParamsWithOneCotangentGetTwoGradients) {
  nn::Scope root;
  nn::Param a = root.param("a", {DType::f32, {4}}, nn::Init::zeros());
  nn::Param b = root.param("b", {DType::f32, {4}}, nn::Init::zeros());
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& x) { return sum((Tensor(a) + Tensor(b)) * x[0]); };
  const StepProgram p = trace_train_step(root.store(), *opt(), loss, {{DType::f32, {2, 4}}}, 0, "test", false, 1);
  const std::vector<int> g = p.grads();
  ASSERT_EQ(g.size(), 2u);
  EXPECT_NE(g[0], g[1]);
  EXPECT_EQ(p.micro_grads(0), g);
  int copies = 0;
  for (const Node& n : p.graph->nodes()) copies += n.attrs.has("name") && n.attrs.s("name") == "gradient_copy";
  EXPECT_EQ(copies, 1);
}

TEST(Microbatches, BadCountsAreRefusedWithTheFix) {
  Fixture f(gpt_micro(), 8);
  auto make = [&](TrainStepOptions o) {
    return [&f, o] { TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, o); };
  };
  std::string e = testing::user_error_of(make({.microbatches = 0}));
  EXPECT_TRUE(has(e, "microbatches must be >= 1, got 0") || has(e, "microbatches must be >= 1")) << e;
  e = testing::user_error_of(make({.microbatches = 3}));
  EXPECT_TRUE(has(e, "microbatches = 3 does not divide batch array 0")) << e;
  EXPECT_TRUE(has(e, "leading dim 8")) << e;
  // 8 rows over 2 devices: 4 each, which 8 microbatches do not divide.
  e = testing::user_error_of(make(testing::on_mesh(Mesh::cpu({{"data", 2}}), ShardingStrategy::DDP, {}, {.microbatches = 8})));
  EXPECT_TRUE(has(e, "does not divide the rows of batch array 0")) << e;
  EXPECT_TRUE(has(e, "4 rows each")) << e;
}

}  // namespace
}  // namespace px
