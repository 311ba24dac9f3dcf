// From an ExperimentConfig to the library's objects: the model, optimizer, mesh and sharding.
#pragma once

#include <memory>

#include "parallax/distributed.h"
#include "parallax/nn.h"
#include "parallax/optim.h"
#include "parallax/parallel.h"
#include "parallax/pax.h"
#include "parallax/pipeline.h"

namespace px::pax {

nn::LmConfig lm_config(const ExperimentConfig& c);
optim::Schedule make_schedule(const ExperimentConfig& c);
optim::OptimizerPtr make_optimizer(const ExperimentConfig& c);
// The batch the step takes: tokens i32[B, S], targets i32[B, S], weights f32[B, S].
std::vector<TensorType> batch_types(const ExperimentConfig& c);
// This process's place in a job launched by mpirun or srun (docs/distributed.md); nullptr when
// pax runs as one process. Rank 0 alone writes the job dir's logs, metrics and summaries.
const ProcessWorld* launched_world();
// The devices: `text` ("cpu:N"), else PX_DEVICES, else (planning) as many as the mesh names.
// Under mpirun / srun (not planning): every process's devices (PX_DEVICES each).
DeviceSet resolve_devices(const ExperimentConfig& c, const std::string& text, bool for_planning);
// The config's mesh on those devices; an empty mesh is one device ("data:1").
Mesh make_mesh(const ExperimentConfig& c, const DeviceSet& devices);
ShardingStrategy strategy_of(const ExperimentConfig& c);
ShardingOptions sharding_options(const ExperimentConfig& c);
// The pipeline settings (sharding.schedule, virtual_stages, layers_per_stage) for a mesh with a
// `stage` axis; throws px::UserError naming a layers_per_stage item that is not a count.
PipelineOptions pipeline_options(const ExperimentConfig& c);
// The placement of every param from shapes alone (nothing allocated).
// AUTO solves for the whole step on `cluster` ("": sharding.cluster).
ShardingPlan sharding_plan(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh,
                           const std::string& cluster = "");
// Bytes per device of the optimizer state under a plan: a slot of its param's shape is split
// like it; other slots (factored moments) are counted whole.
int64_t optimizer_bytes_per_device(const ExperimentConfig& c, const ShardingPlan& plan);
PlanReport plan_report(const ExperimentConfig& c, const nn::TransformerLm& model, const ShardingPlan& plan);
// One row per param: path, shape, dtype, spec (for DIR/model_params.txt).
std::string model_params_text(const ShardingPlan& plan);

}  // namespace px::pax
