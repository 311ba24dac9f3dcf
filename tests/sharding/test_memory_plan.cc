// One schedule and one buffer plan per device: the per-device peak of a sharded step is known
// before it runs, split by category, and equals the allocator's measured high-water mark; FSDP
// frees gathered weights after use (ZeRO-3) and holds at most the lookahead's worth at once.
#include <gtest/gtest.h>

#include "ir/primitive.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/parallel.h"
#include "recipe_check.h"
#include "testing.h"

namespace px {
namespace {

using recipe_check::Fixture;

std::unique_ptr<TrainStep> make_step(Fixture& f, const Mesh& mesh, ShardingStrategy s, int lookahead = 1) {
  TrainStepOptions o;
  o.compile.collective_lookahead = lookahead;
  return std::make_unique<TrainStep>(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                                     px::testing::on_mesh(mesh, s, ShardingOptions{}, o));
}

int64_t sum(const std::array<int64_t, kNumMemoryCategories>& a) {
  int64_t s = 0;
  for (int64_t x : a) s += x;
  return s;
}

int64_t cat(const MemoryReport& r, MemoryCategory c) { return r.by_category[static_cast<int>(c)]; }

// bench-gpt with 12 layers on 8 virtual devices: FSDP plans at most 35% of DDP's per-device peak,
// and what a device allocates while the step runs is exactly what the plan said.
TEST(MemoryPlan, FsdpPeakIsAFractionOfDdpAndEqualsTheMeasuredHighWaterMark) {
  Fixture f(nn::gpt2_config("bench_gpt_12", 8192, 512, 8, 12, 2048, 256));
  Mesh mesh = Mesh::cpu({{"data", 8}});
  auto ddp = make_step(f, mesh, ShardingStrategy::DDP);
  auto fsdp = make_step(f, mesh, ShardingStrategy::FSDP);
  MemoryReport d = ddp->program().memory(), s = fsdp->program().memory();
  std::cout << "DDP  " << d.to_string() << "FSDP " << s.to_string();
  EXPECT_LE(static_cast<double>(s.peak_bytes), 0.35 * static_cast<double>(d.peak_bytes));
  // What the schedule and the buffer plan add to what must be alive: the tied embedding is gathered
  // again for the head instead of held through the forward pass, the head's backward gather waits
  // for room under the peak, and the arena places the largest buffers first.
  EXPECT_LE(s.peak_over_floor(), 1.05);
  EXPECT_LE(d.peak_over_floor(), 1.05);
  // The split accounts for every byte in use at the peak.
  for (const MemoryReport* r : {&d, &s}) {
    EXPECT_EQ(sum(r->by_category), r->input_bytes + r->output_bytes + r->arena_live_bytes);
    EXPECT_EQ(r->peak_bytes, r->input_bytes + r->output_bytes + r->arena_bytes);
  }
  // DDP holds the whole model and its AdamW state (once: the new ones are written into them); FSDP
  // an eighth.
  const int64_t params = f.model.store().param_count() * 4;
  EXPECT_EQ(cat(d, MemoryCategory::params), params);
  EXPECT_EQ(cat(d, MemoryCategory::optimizer_state), 2 * params);
  EXPECT_LE(cat(s, MemoryCategory::params), params / 8 + (1 << 20));  // small params stay replicated
  EXPECT_EQ(ddp->program().peak_bytes(3), d.peak_bytes);
  ddp.reset();  // its arenas are allocated on the devices too

  // Run FSDP: the last device holds nothing but its shards, the batch and the arena.
  TrainState st = fsdp->init(0);
  auto batch = f.batch(0);
  (*fsdp)(st, batch);  // the first step allocates the metrics' arrays that later steps reuse
  Placement last{mesh.device_ids().back()};
  reset_peak_memory(last);
  float loss = (*fsdp)(st, batch).loss;
  EXPECT_TRUE(std::isfinite(loss));
  EXPECT_EQ(memory_stats(last).peak_bytes_in_use, s.peak_bytes);
}

// A 4-layer model under FSDP: with lookahead 1 at most two layers' gathered weights are alive at
// once; a lookahead as long as the program gathers further ahead, as far as the room under the
// peak allows: gathering ahead of use never raises the peak over gathering at first use.
TEST(MemoryPlan, FsdpGathersAreFreedAfterUseAndPrefetchedByTheLookahead) {
  Fixture f(nn::gpt2_config("gpt_4", 512, 128, 4, 4, 512, 32));
  Mesh mesh = Mesh::cpu({{"data", 4}});
  int64_t layer = 0;
  const std::vector<std::string> paths = f.model.store().paths();
  const std::vector<TensorType> types = f.model.store().types();
  for (size_t i = 0; i < paths.size(); ++i)
    if (paths[i].rfind("blocks.0.", 0) == 0) layer += types[i].nbytes();
  auto at_use = make_step(f, mesh, ShardingStrategy::FSDP, 0);
  auto one = make_step(f, mesh, ShardingStrategy::FSDP, 1);
  auto eager = make_step(f, mesh, ShardingStrategy::FSDP, 1000);
  auto gathered = [](const TrainStep& s) {
    return s.program().memory().arena_max_by_category[static_cast<int>(MemoryCategory::collective_buffers)];
  };
  const int64_t held0 = gathered(*at_use), held = gathered(*one), held_eager = gathered(*eager);
  const int64_t peak0 = at_use->program().memory().peak_bytes;
  std::cout << "one layer " << layer << " bytes; gathered at once: lookahead 0 " << held0 << ", 1 " << held
            << ", eager " << held_eager << "; peaks " << peak0 << ", "
            << one->program().memory().peak_bytes << ", " << eager->program().memory().peak_bytes
            << "\n";
  EXPECT_GT(held0, 0);
  EXPECT_LE(held, 2 * layer);
  EXPECT_GT(held_eager, held);
  // The bytes live at once stay those of gathering at first use (the arena around them may
  // fragment more when every gap below the peak is filled), the kernels' scratch at the peak aside
  // (the working memory of whichever kernel runs there).
  auto live = [](const TrainStep& s) {
    const MemoryReport m = s.program().memory();
    return m.arena_live_bytes - m.by_category[static_cast<int>(MemoryCategory::kernel_scratch)];
  };
  const int64_t live0 = live(*at_use);
  for (const TrainStep* s : {one.get(), eager.get()}) EXPECT_LE(live(*s), live0);
  // All three give the same step.
  TrainState a = one->init(0), b = eager->init(0), c = at_use->init(0);
  auto batch = f.batch(0);
  const float loss = (*one)(a, batch).loss;
  EXPECT_EQ(loss, (*eager)(b, batch).loss);
  EXPECT_EQ(loss, (*at_use)(c, batch).loss);
}

// Under bf16 compute FSDP gathers bf16 weights (half the bytes moved and held): a cast commutes
// with a gather, so the values are those of gathering f32 and casting after.
TEST(MemoryPlan, FsdpGathersMoveTheComputeDtype) {
  Fixture f(nn::gpt2_config("gpt_2", 512, 128, 4, 2, 512, 32));
  Mesh mesh = Mesh::cpu({{"data", 4}});
  TrainStepOptions o;
  o.compile.compute_dtype = DType::bf16;
  TrainStep step(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                 px::testing::on_mesh(mesh, ShardingStrategy::FSDP, ShardingOptions{}, o));
  int bf16 = 0, f32 = 0, weights = 0;
  const Graph& local = step.program().executable().graph();
  for (const Node& n : local.nodes()) {
    if (n.prim->name != "all_gather") continue;
    if (local.type(n.outputs[0]).dtype == DType::bf16)
      ++bf16;
    else
      ++f32;
  }
  const std::vector<std::string> paths = f.model.store().paths();
  const std::vector<TensorType> types = f.model.store().types();
  for (size_t i = 0; i < paths.size(); ++i)
    if (paths[i].rfind("blocks.", 0) == 0 && types[i].rank() == 2) ++weights;
  std::cout << bf16 << " bf16 gathers, " << f32 << " f32 gathers, " << weights << " block weights\n";
  EXPECT_GE(bf16, 2 * weights);  // each weight gathered for the forward and again for the backward pass
  TrainState st = step.init(0);
  EXPECT_TRUE(std::isfinite(step(st, f.batch(0)).loss));
}

// The step is one schedule of kernels and collectives for every device, not one executable per
// segment between collectives.
TEST(MemoryPlan, DdpStepIsOneScheduleWithCollectivesAsNodes) {
  Fixture f(nn::gpt2_config("gpt_6", 512, 64, 4, 6, 256, 16));
  Mesh mesh = Mesh::cpu({{"data", 4}});
  auto ddp = make_step(f, mesh, ShardingStrategy::DDP);
  const Executable& exe = ddp->program().executable();
  EXPECT_EQ(exe.num_devices(), 4);
  EXPECT_GT(ddp->program().program().collectives.size(), 6u);
  std::string sum = exe.summary();
  EXPECT_NE(sum.find("all_reduce.start"), std::string::npos);
  EXPECT_NE(sum.find("all_reduce.wait"), std::string::npos);
}

}  // namespace
}  // namespace px
