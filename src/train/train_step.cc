// px::TrainStep and px::ForwardFn: the public faces of the one step path (steps.h). One device is a
// mesh of one device; the state is each param as this process's shards on every mesh.
#include <algorithm>

#include "train/steps.h"

namespace px {

TrainStep::TrainStep(nn::ParamStore& store, optim::OptimizerPtr opt, LossFn loss_fn,
                     std::vector<TensorType> batch_types, TrainStepOptions options) {
  if (!opt) throw Error("[TrainStep] no optimizer given");
  step_ = std::make_unique<detail::Step>(store, std::move(opt), std::move(loss_fn), std::move(batch_types), options);
}

TrainStep::~TrainStep() = default;

// Each device generates its own shard of every param (nn::init_box: counter-based, the bits of the
// whole param's init), so no process holds a whole param beyond the one being generated.
TrainState TrainStep::init(uint64_t seed) const {
  const nn::ParamStore& store = step_->store();
  TrainState s = begin_state();
  for (size_t i = 0; i < store.size(); ++i) {
    const nn::ParamSpec& spec = store.spec(static_cast<int>(i));
    set_param(s, static_cast<int>(i),
              [&spec, seed](const std::vector<int64_t>& offsets, Array& out) { nn::init_box(spec, seed, offsets, out); });
  }
  return s;
}

TrainState TrainStep::init(const std::vector<Array>& params) const {
  const size_t n = step_->store().size();
  if (params.size() != n)
    throw Error("[TrainStep] got " + std::to_string(params.size()) + " params, the model has " + std::to_string(n));
  TrainState s = begin_state();
  for (size_t i = 0; i < n; ++i) set_param(s, static_cast<int>(i), params[i]);
  return s;
}

TrainState TrainStep::begin_state() const { return step_->begin_state(); }
void TrainStep::set_param(TrainState& s, int i, const Array& full) const { step_->set_param(s, i, full); }
void TrainStep::set_param(TrainState& s, int i, const BoxReader& read) const { step_->set_param(s, i, read); }
StepMetrics TrainStep::operator()(TrainState& state, const std::vector<Array>& batch) { return (*step_)(state, batch); }
std::vector<Array> TrainStep::gather_params(const TrainState& s) const { return step_->gather_params(s); }
std::vector<Array> TrainStep::gather_opt_state(const TrainState& s) const { return step_->gather_opt_state(s); }

std::vector<std::string> TrainStep::state_names() const {
  const ckpt::StateLayout l = step_->layout();
  return std::vector<std::string>(l.names.begin() + static_cast<std::ptrdiff_t>(l.n_params), l.names.end());
}

void TrainStep::save(const std::string& dir, const TrainState& state) const { step_->save(dir, state); }
TrainState TrainStep::load(const std::string& dir) const { return step_->load(dir); }
Checkpoint TrainStep::checkpoint(const TrainState& state) const {
  return step_->checkpoint(state, "TrainStep::checkpoint");
}
RestoreOptions TrainStep::restore_options() const { return step_->restore_options(); }
TrainState TrainStep::restore(const Checkpoint& c) const {
  return step_->restore(c, "[TrainStep::restore] the checkpoint of step " + std::to_string(c.step));
}
const ShardingPlan& TrainStep::plan() const { return step_->plan(); }
std::string TrainStep::collectives_table() const { return step_->collectives_table(); }
const Graph& TrainStep::graph() const { return step_->graph(); }
int TrainStep::num_programs() const { return step_->num_programs(); }
const ShardedExecutable& TrainStep::program(int i) const { return step_->program(i); }
ShardedExecutable& TrainStep::program(int i) { return step_->program(i); }
int64_t TrainStep::peak_bytes() const { return step_->peak_bytes(); }
bool TrainStep::pipelined() const { return step_->pipelined(); }
const PipelineReport& TrainStep::pipeline_report() const { return step_->pipeline_report(); }
const optim::Optimizer& TrainStep::optimizer() const { return step_->optimizer(); }
const Sharding& TrainStep::batch_sharding(int i) const { return step_->batch_sharding(i); }
int64_t TrainStep::steps_run() const { return step_->steps_run(); }
int TrainStep::process() const { return step_->process(); }

// ---- ForwardFn ----------------------------------------------------------------------------------

ForwardFn::ForwardFn(nn::ParamStore& store, Fn fn, std::vector<TensorType> batch_types, ForwardOptions options) {
  nn::ParamStore* s = &store;
  auto bound = [s, fn](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    nn::ParamBinding b = s->bind(params);
    return fn(args);
  };
  fn_ = std::make_unique<ShardedFunction>(bound, store.types(), store.paths(), std::move(batch_types), options);
}

ForwardFn::~ForwardFn() = default;

std::vector<Array> ForwardFn::operator()(const std::vector<Array>& params, const std::vector<Array>& batch) {
  return (*fn_)(params, batch);
}

std::vector<Array> ForwardFn::operator()(std::vector<Array>& params, std::vector<Array>& batch) {
  return (*fn_)(params, batch);
}

const Executable& ForwardFn::executable() const { return fn_->executable().executable(); }
const ShardedFunction& ForwardFn::sharded() const { return *fn_; }

}  // namespace px
