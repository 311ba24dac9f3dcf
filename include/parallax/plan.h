// Planning a Transformer LM's training step from shapes alone (nothing allocated): the recipes
// costed and AUTO's plan for a model config on a mesh and cluster (auto.h), as TrainStep on that
// mesh would decide them. Above the AUTO search (src/sharding/auto/), which takes a traced program.
//
//   px::Cluster c = px::load_cluster("h100x8");
//   px::Mesh mesh = c.apply(px::Mesh::parse("data:32,model:8", px::parse_devices("cpu:256")));
//   for (const px::RecipeCost& r : px::cost_recipes(px::nn::bench_gpt(), mesh, c, {.batch = 256}))
//     std::cout << px::strategy_name(r.strategy) << ": " << (r.applies ? r.cost.to_string() : r.reason);
//   px::AutoPlan a = px::plan_auto(px::nn::bench_gpt(), mesh, c, {.batch = 256});
//   std::cout << a.explain();                                     // the plan beside the recipes, and why
#pragma once

#include <vector>

#include "parallax/auto.h"
#include "parallax/pipeline.h"
#include "parallax/nn/transformer.h"

namespace px {

// The recipes DDP, FSDP, TP and FSDP_TP costed for a TransformerLm next-token training step from
// shapes alone (no param is allocated): traced from types, decided and partitioned as
// TrainStep on a mesh would, planned and costed on `mesh` (its links as given: pass
// cluster.apply(mesh) for the cluster's). A recipe that does not apply (no model axis, a dim
// that does not divide) has applies = false and the reason.
std::vector<RecipeCost> cost_recipes(const nn::LmConfig& cfg, const Mesh& mesh, const Cluster& cluster,
                                     const StepSetup& setup = {},
                                     const std::vector<ShardingStrategy>& strategies = {
                                         ShardingStrategy::DDP, ShardingStrategy::FSDP, ShardingStrategy::TP,
                                         ShardingStrategy::FSDP_TP});

// AUTO for a TransformerLm next-token training step from shapes alone (nothing allocated): the
// same search TrainStep on a mesh runs, with the cluster given here and setup.sharding's limits.
// Deep models are searched on a copy with fewer layers (identical layers are linked) and the
// chosen plan is costed on the whole model.
AutoPlan plan_auto(const nn::LmConfig& cfg, const Mesh& mesh, const Cluster& cluster, const StepSetup& setup = {});

// A pipelined step (a mesh with a `stage` axis; `strategy` inside each stage) planned without
// allocating anything: its stages, each device group's planned memory and messages, and with a
// cluster (whose links the mesh carries: Cluster::apply) the predicted step time and bubble, each
// stage program timed by the cost model and played in the schedule's order.
PipelineReport plan_pipeline(const nn::LmConfig& cfg, const Mesh& mesh, ShardingStrategy strategy,
                             const StepSetup& setup, const PipelineOptions& pipeline, const Cluster* cluster = nullptr);

// AUTO's pipelined candidates for `devices` devices of `cluster`: every stage count S > 1 dividing
// both the devices and the layers (the `stage` axis outermost, so that a stage's devices are
// neighbours), the other devices a `data` axis with DDP or FSDP inside the stages, 1F1B and
// zero-bubble, 2S and 4S microbatches where they divide each device's rows; each planned and
// predicted by plan_pipeline. Fastest first, those that fit the cluster's memory before the rest;
// stops adding candidates after time_limit_s.
struct PipelineCandidate {
  Mesh mesh;
  ShardingStrategy strategy = ShardingStrategy::DDP;
  PipelineOptions pipeline;
  int microbatches = 1;
  PipelineReport report;
  bool fits = false;
  std::string settings() const;  // pax's flags: "--set sharding.mesh=stage:8,data:8 --set sharding.strategy=ddp ..."
};
std::vector<PipelineCandidate> search_pipelines(const nn::LmConfig& cfg, int64_t devices, const Cluster& cluster,
                                                const StepSetup& setup, double time_limit_s = 20);

}  // namespace px
