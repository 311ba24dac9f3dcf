#include "pax/step_runner.h"

#include "ir/primitive.h"
#include "train/state_file.h"
#include "parallax/nn/pretrained.h"
#include "pax/model.h"
#include "train/steps.h"

namespace px::pax {

TrainStepOptions step_options(const ExperimentConfig& c) {
  TrainStepOptions o;
  o.clip_norm = c.optimizer.clip_norm;
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

// The checkpoint names: params by path, then optimizer state "<path>.<slot>".
std::vector<std::string> state_names(const nn::TransformerLm& model, const optim::Optimizer& opt) {
  return detail::checkpoint_layout(model.store(), opt).names;
}

// The restored tensor `name`, checked against the type the step wants.
const ShardedArray& restored(const Checkpoint& c, const std::string& name, const TensorType& want) {
  const ShardedArray& a = c.get(name);
  if (a.type() != want)
    throw Error("[pax] checkpoint tensor '" + name + "' is " + type_str(a.type()) + " but this run's is " +
                type_str(want));
  return a;
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
  return o;
}

}  // namespace

StepRunner::StepRunner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh)
    : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), options_on(c, mesh)),
      state_(step_.init(c.train.seed)),
      names_(state_names(model, *make_optimizer(c))) {}

void StepRunner::init_from_pretrained(const std::string& dir) {
  TrainState s = step_.begin_state();
  nn::load_pretrained_slices(dir, [&](int i, const BoxReader& read) { step_.set_param(s, i, read); });
  state_ = std::move(s);
}

Checkpoint StepRunner::snapshot() const {
  Checkpoint c(state_.step);
  const size_t np = state_.params.size();
  for (size_t i = 0; i < np; ++i) c.add(names_[i], state_.params[i], "params");
  for (size_t i = 0; i < state_.opt_state.size(); ++i) c.add(names_[np + i], state_.opt_state[i], "opt_state");
  return c;
}

std::map<std::string, Sharding> StepRunner::shardings() const {
  std::map<std::string, Sharding> out;
  for (size_t i = 0; i < names_.size(); ++i)
    out[names_[i]] = step_.sharded_executable().in_sharding(static_cast<int>(i));
  return out;
}

void StepRunner::restore(const Checkpoint& c) {
  TrainState s;
  const size_t np = state_.params.size();
  for (size_t i = 0; i < names_.size(); ++i) {
    const ShardedArray& now = i < np ? state_.params[i] : state_.opt_state[i - np];
    const ShardedArray& a = restored(c, names_[i], now.type());
    const ShardedArray& got = a;
    if (got.sharding() != now.sharding())
      throw InternalError("[pax] checkpoint tensor '" + names_[i] + "' was restored onto " + a.sharding().to_string() +
                          ", the step holds it as " + now.sharding().to_string());
    (i < np ? s.params : s.opt_state).push_back(std::move(got));
  }
  s.step = c.step;
  state_ = std::move(s);
}

std::vector<int> StepRunner::device_ids() const {
  const Mesh& m = step_.sharded_executable().program().mesh;
  std::vector<int> ids;
  for (int p : step_.sharded_executable().positions()) ids.push_back(m.device_ids()[p]);
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
  for (int i = 0; i < p.backward_end; ++i) {
    const Node& n = g.nodes()[i];
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
