#include "pax/step_runner.h"

#include "ir/primitive.h"
#include "parallax/nn/pretrained.h"
#include "pax/model.h"
#include "train/steps.h"

namespace px::pax {

TrainStepOptions step_options(const ExperimentConfig& c) {
  TrainStepOptions o;
  o.clip_norm = c.optimizer.clip_norm;
  o.microbatches = static_cast<int>(c.train.microbatches);
  o.skip_nonfinite = c.train.on_nonfinite == "skip";
  o.remat.policy = parse_remat_policy(c.memory.remat);
  o.remat.budget_bytes = c.memory.budget_bytes;
  if (c.memory.offload == "params" || c.memory.offload == "params_and_optimizer_state") o.offload.params = {"*"};
  o.offload.optimizer_state = c.memory.offload == "optimizer_state" || c.memory.offload == "params_and_optimizer_state";
  o.offload.prefetch_depth = static_cast<int>(c.memory.prefetch_depth);
  return o;
}

namespace {

TrainStep::LossFn loss_fn(nn::TransformerLm& model) {
  return [&model](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1], b[2]); };
}

// A mesh over several processes (pax under mpirun) runs on the job's communicator. A mesh of one
// device runs the one-device step.
TrainStepOptions options_on(const ExperimentConfig& c, const Mesh& mesh) {
  TrainStepOptions o = step_options(c);
  if (mesh.size() == 1) return o;
  o.mesh = mesh;
  o.strategy = strategy_of(c);
  o.sharding = sharding_options(c);
  if (mesh.num_processes() > 1) o.sharding.communicator = process_world().communicator;
  o.pipeline = pipeline_options(c);
  return o;
}

}  // namespace

StepRunner::StepRunner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh)
    : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), options_on(c, mesh)),
      state_(step_.init(c.train.seed)) {}

void StepRunner::init_from_pretrained(const std::string& dir) {
  TrainState s = step_.begin_state();
  nn::load_pretrained_slices(dir, [&](int i, const BoxReader& read) { step_.set_param(s, i, read); });
  state_ = std::move(s);
}

// This process's devices of the mesh (a pipeline's: those of its stages).
std::vector<int> StepRunner::device_ids() const {
  const Mesh& m = step_.plan().mesh;
  std::vector<int> ids;
  for (int p : m.local_positions(step_.process())) ids.push_back(m.device_ids()[p]);
  return ids;
}

const Executable& StepRunner::executable() const {
  return step_.executable();
}

std::unique_ptr<StepRunner> make_step_runner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh) {
  return std::make_unique<StepRunner>(c, model, mesh);
}

double model_flops_per_step(const ExperimentConfig& c, nn::TransformerLm& model) {
  StepProgram p = trace_train_step(model.store(), *make_optimizer(c), loss_fn(model), batch_types(c), 0, "pax");
  const Graph& g = *p.graph;
  double flops = 0;
  for (const Node& n : g.nodes()) {
    if (n.facts.phase != StepPhase::forward && n.facts.phase != StepPhase::backward) continue;
    std::vector<TensorType> ins, outs;
    for (int v : n.inputs) ins.push_back(g.type(v));
    for (int v : n.outputs) outs.push_back(g.type(v));
    flops += cost_of(*n.prim, ins, outs, n.attrs).matmul_flops;
  }
  return flops;
}

ShardingPlan auto_plan(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh,
                       const std::string& cluster) {
  ShardingOptions o = sharding_options(c);
  if (!cluster.empty()) o.auto_cluster = cluster;
  if (mesh.size() == 1) {
    auto fwd = nn::trace_with_params(
        model.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss_fn(model)(b)}; },
        batch_types(c));
    ShardingPlan p = plan_sharding(*fwd, model.store().paths(), mesh, ShardingStrategy::DDP, o);
    p.strategy = ShardingStrategy::AUTO;
    return p;
  }
  TrainStepOptions to = step_options(c);
  to.mesh = mesh;
  to.strategy = ShardingStrategy::AUTO;
  to.sharding = o;
  return detail::decide_step(model.store(), *make_optimizer(c), loss_fn(model), batch_types(c), to).plan;
}

}  // namespace px::pax
