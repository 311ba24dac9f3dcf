#include "pax/step_runner.h"

#include "ir/primitive.h"
#include "optim/checkpoint.h"
#include "parallax/nn/pretrained.h"
#include "pax/model.h"
#include "sharding/recipes/step.h"

namespace px::pax {

TrainStepOptions step_options(const ExperimentConfig& c) {
  TrainStepOptions o;
  o.clip_norm = c.optimizer.clip_norm;
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

// A TrainState or ShardedTrainState as checkpoint entries named by `names` (params, then state).
template <class State>
Checkpoint snapshot_of(const State& state, const std::vector<std::string>& names) {
  Checkpoint c(state.step);
  const size_t np = state.params.size();
  for (size_t i = 0; i < np; ++i) c.add(names[i], state.params[i], "params");
  for (size_t i = 0; i < state.opt_state.size(); ++i) c.add(names[np + i], state.opt_state[i], "opt_state");
  return c;
}

class SingleRunner : public StepRunner {
 public:
  SingleRunner(const ExperimentConfig& c, nn::TransformerLm& model)
      : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), step_options(c)),
        state_(step_.init(c.train.seed)),
        names_(state_names(model, *make_optimizer(c))) {}
  StepMetrics step(const std::vector<Array>& batch) override { return step_(state_, batch); }
  std::vector<Array> params() const override { return state_.params; }
  int64_t step_count() const override { return state_.step; }
  void init_from_pretrained(const std::string& dir) override { state_ = step_.init(nn::load_pretrained(dir).params); }
  Checkpoint snapshot() const override { return snapshot_of(state_, names_); }
  std::map<std::string, Sharding> shardings() const override { return {}; }
  const Executable& executable() const override { return step_.executable(); }
  void restore(const Checkpoint& c) override {
    TrainState s;
    const size_t np = state_.params.size();
    for (size_t i = 0; i < names_.size(); ++i) {
      const Array& now = i < np ? state_.params[i] : state_.opt_state[i - np];
      Array a = restored(c, names_[i], now.type()).shard(0);
      (i < np ? s.params : s.opt_state).push_back(std::move(a));
    }
    s.step = c.step;
    state_ = std::move(s);
  }

 private:
  TrainStep step_;
  TrainState state_;
  std::vector<std::string> names_;
};

class ShardedRunner : public StepRunner {
  // A mesh over several processes (pax under mpirun) runs on the job's communicator.
  static ShardingOptions options(const ExperimentConfig& c, const Mesh& mesh) {
    ShardingOptions o = sharding_options(c);
    if (mesh.num_processes() > 1) o.communicator = process_world().communicator;
    return o;
  }

 public:
  ShardedRunner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh)
      : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), mesh, strategy_of(c), options(c, mesh),
              step_options(c)),
        state_(step_.init(c.train.seed)),
        names_(state_names(model, *make_optimizer(c))) {}
  StepMetrics step(const std::vector<Array>& batch) override { return step_(state_, batch); }
  // A collective over several processes: every process calls it.
  std::vector<Array> params() const override { return step_.gather_params(state_); }
  int64_t step_count() const override { return state_.step; }
  void init_from_pretrained(const std::string& dir) override {
    ShardedTrainState s = step_.begin_state();
    // Each device reads only its own shard of each tensor (each process only its part).
    nn::load_pretrained_slices(dir, [&](int i, const BoxReader& read) { step_.set_param(s, i, read); });
    state_ = std::move(s);
  }
  Checkpoint snapshot() const override { return snapshot_of(state_, names_); }
  const ShardingPlan* plan() const override { return &step_.plan(); }
  const Executable& executable() const override { return step_.executable().executable(); }
  std::vector<int> device_ids() const override {
    const Mesh& m = step_.executable().program().mesh;
    std::vector<int> ids;
    for (int p : step_.executable().positions()) ids.push_back(m.device_ids()[p]);
    return ids;
  }
  std::map<std::string, Sharding> shardings() const override {
    std::map<std::string, Sharding> out;
    for (size_t i = 0; i < names_.size(); ++i) out[names_[i]] = step_.executable().in_sharding(static_cast<int>(i));
    return out;
  }
  void restore(const Checkpoint& c) override {
    ShardedTrainState s;
    const size_t np = state_.params.size();
    for (size_t i = 0; i < names_.size(); ++i) {
      const ShardedArray& now = i < np ? state_.params[i] : state_.opt_state[i - np];
      const ShardedArray& a = restored(c, names_[i], now.type());
      if (a.sharding() != now.sharding())
        throw InternalError("[pax] checkpoint tensor '" + names_[i] + "' was restored onto " +
                            a.sharding().to_string() + ", the step holds it as " + now.sharding().to_string());
      (i < np ? s.params : s.opt_state).push_back(a);
    }
    s.step = c.step;
    state_ = std::move(s);
  }

 private:
  ShardedTrainStep step_;
  ShardedTrainState state_;
  std::vector<std::string> names_;
};

}  // namespace

std::unique_ptr<StepRunner> make_step_runner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh) {
  if (mesh.size() > 1) return std::make_unique<ShardedRunner>(c, model, mesh);
  return std::make_unique<SingleRunner>(c, model);
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
  return decide_sharded_step(model.store(), *make_optimizer(c), loss_fn(model), batch_types(c), mesh,
                             ShardingStrategy::AUTO, o, step_options(c))
      .plan;
}

}  // namespace px::pax
