// px::TrainStep: one type for one device and for a mesh. It holds the way it runs (steps.h) and
// gives both the same state (each param as this process's shards) and the same calls.
#include <algorithm>

#include "optim/checkpoint.h"
#include "parallax/io.h"
#include "train/steps.h"

namespace px {

namespace detail {

CheckpointLayout checkpoint_layout(const nn::ParamStore& store, const optim::Optimizer& opt) {
  CheckpointLayout l;
  l.names = store.paths();
  l.types = store.types();
  l.n_params = l.names.size();
  l.optimizer = opt.name();
  std::vector<std::string> paths = l.names;
  for (const optim::StateSlot& s : opt.state_slots(store.types())) {
    l.names.push_back(paths[s.param] + "." + s.name);
    l.types.push_back(s.type);
  }
  return l;
}

void write_checkpoint(const std::string& path, const CheckpointLayout& layout, const std::vector<Array>& params,
                      const std::vector<Array>& opt_state, int64_t step, const std::string& who) {
  if (params.size() != layout.n_params || params.size() + opt_state.size() != layout.names.size())
    throw Error("[" + who + "::save] the state does not belong to this step (make it with " + who + "::init)");
  std::vector<Array> arrays = params;
  arrays.insert(arrays.end(), opt_state.begin(), opt_state.end());
  for (size_t i = 0; i < arrays.size(); ++i)
    if (arrays[i].type() != layout.types[i])
      throw Error("[" + who + "::save] the state's tensor '" + layout.names[i] + "' is " + type_str(arrays[i].type()) +
                  " but this step has " + type_str(layout.types[i]) +
                  "; the state does not belong to this step (make it with " + who + "::init)");
  save_safetensors(path, layout.names, arrays, {{"step", std::to_string(step)}, {"optimizer", layout.optimizer}});
}

}  // namespace detail

namespace {

// On one device each param is one shard holding the whole array.
ShardedArray whole(const Array& a, const Sharding& replicated) { return ShardedArray(a.type(), replicated, {a}); }

}  // namespace

TrainStep::TrainStep(nn::ParamStore& store, optim::OptimizerPtr opt, LossFn loss_fn,
                     std::vector<TensorType> batch_types, TrainStepOptions options) {
  if (!opt) throw Error("[TrainStep] no optimizer given");
  if (options.mesh)
    mesh_ =
        std::make_unique<detail::MeshStep>(store, std::move(opt), std::move(loss_fn), std::move(batch_types), options);
  else
    one_ = std::make_unique<detail::OneDeviceStep>(store, std::move(opt), std::move(loss_fn), std::move(batch_types),
                                                   options);
}

TrainStep::~TrainStep() = default;

TrainState TrainStep::init(uint64_t seed) const { return init((one_ ? one_->store() : mesh_->store()).init(seed)); }

TrainState TrainStep::init(const std::vector<Array>& params) const {
  const size_t n = (one_ ? one_->store() : mesh_->store()).size();
  if (params.size() != n)
    throw Error("[TrainStep] got " + std::to_string(params.size()) + " params, the model has " + std::to_string(n));
  TrainState s = begin_state();
  for (size_t i = 0; i < n; ++i) set_param(s, static_cast<int>(i), params[i]);
  return s;
}

TrainState TrainStep::begin_state() const {
  if (mesh_) return mesh_->begin_state();
  TrainState s;
  s.params.resize(one_->n_params());
  s.opt_state.resize(one_->n_state());
  return s;
}

namespace {

void check_one_device_param(const TrainState& s, int i, const TensorType& type, const nn::ParamStore& store,
                            size_t n_state) {
  if (s.params.size() != static_cast<size_t>(store.size()) || s.opt_state.size() != n_state)
    throw Error("[TrainStep] set_param: the state does not belong to this step (make it with begin_state)");
  if (i < 0 || static_cast<size_t>(i) >= s.params.size())
    throw Error("[TrainStep] set_param: param index " + std::to_string(i) + " is outside [0, " +
                std::to_string(s.params.size()) + ")");
  const TensorType want = store.types()[i];
  if (type != want)
    throw Error("[TrainStep] set_param: param '" + store.paths()[i] + "' is " + type_str(want) + ", got " +
                type_str(type));
}

}  // namespace

void TrainStep::set_param(TrainState& s, int i, const Array& full) const {
  if (mesh_) return mesh_->set_param(s, i, full);
  check_one_device_param(s, i, full.type(), one_->store(), one_->n_state());
  // The param and its optimizer state go where the step keeps them (offload: pinned_host) now, one
  // param at a time, so that a model whose state only fits offloaded can be initialized.
  auto placed = [&](const Array& a, size_t input) {
    return whole(a.to({a.placement().device, one_->executable().input_kind(static_cast<int>(input))}),
                 one_->replicated());
  };
  s.params[i] = placed(full, static_cast<size_t>(i));
  std::vector<Array> st = one_->optimizer().init_state({full});
  size_t k = 0;
  const std::vector<optim::StateSlot> slots = one_->optimizer().state_slots(one_->store().types());
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].param == i) {
      if (k >= st.size()) throw InternalError("[TrainStep] set_param: optimizer slots do not line up");
      s.opt_state[j] = placed(st[k++], one_->n_params() + j);
    }
}

void TrainStep::set_param(TrainState& s, int i, const BoxReader& read) const {
  if (mesh_) return mesh_->set_param(s, i, read);
  const std::vector<TensorType> types = one_->store().types();
  check_one_device_param(s, i, i >= 0 && static_cast<size_t>(i) < types.size() ? types[i] : TensorType{}, one_->store(),
                         one_->n_state());
  Array full(types[i].dtype, types[i].shape);
  read(std::vector<int64_t>(types[i].rank(), 0), full);
  set_param(s, i, full);
}

StepMetrics TrainStep::operator()(TrainState& state, const std::vector<Array>& batch) {
  if (mesh_) return (*mesh_)(state, batch);
  if (state.params.size() != one_->n_params() || state.opt_state.size() != one_->n_state())
    throw Error("[TrainStep] the state holds " + std::to_string(state.params.size()) + " params and " +
                std::to_string(state.opt_state.size()) + " optimizer tensors; expected " +
                std::to_string(one_->n_params()) + " and " + std::to_string(one_->n_state()) +
                " (make it with TrainStep::init)");
  for (size_t i = 0; i < state.params.size(); ++i)
    if (state.params[i].shards().size() != 1 || state.params[i].mesh().size() != 1)
      throw Error("[TrainStep] param '" + one_->store().paths()[i] + "' " +
                  (state.params[i].shards().empty()
                       ? std::string("was never set: give every param with set_param (or make the state with init)")
                       : "is split over " + state.params[i].mesh().to_string() +
                             ": this step runs on one device; save the state and load it here, or give the step "
                             "the state's mesh (TrainStepOptions::mesh)"));
  for (const ShardedArray& a : state.opt_state)
    if (a.shards().size() != 1 || a.mesh().size() != 1)
      throw Error("[TrainStep] the optimizer state is not one device's: make the state with this step's init");
  // The arrays move into the step and back (also when it throws), so nothing is copied.
  std::vector<Array> params(state.params.size()), opt_state(state.opt_state.size());
  for (size_t i = 0; i < params.size(); ++i) params[i] = std::move(state.params[i].mutable_shards()[0]);
  for (size_t i = 0; i < opt_state.size(); ++i) opt_state[i] = std::move(state.opt_state[i].mutable_shards()[0]);
  struct Back {
    TrainState& s;
    std::vector<Array>& p;
    std::vector<Array>& o;
    ~Back() {
      for (size_t i = 0; i < p.size(); ++i) s.params[i].mutable_shards()[0] = std::move(p[i]);
      for (size_t i = 0; i < o.size(); ++i) s.opt_state[i].mutable_shards()[0] = std::move(o[i]);
    }
  } back{state, params, opt_state};
  return one_->run(params, opt_state, state.step, state.skipped, batch);
}

std::vector<Array> TrainStep::gather_params(const TrainState& s) const {
  if (mesh_) return mesh_->gather_params(s);
  std::vector<Array> out;
  for (const auto& p : s.params) out.push_back(p.shards().at(0));
  return out;
}

std::vector<Array> TrainStep::gather_opt_state(const TrainState& s) const {
  if (mesh_) return mesh_->gather_opt_state(s);
  std::vector<Array> out;
  for (const auto& p : s.opt_state) out.push_back(p.shards().at(0));
  return out;
}

std::vector<std::string> TrainStep::state_names() const {
  detail::CheckpointLayout l = detail::checkpoint_layout(one_ ? one_->store() : mesh_->store(), optimizer());
  return std::vector<std::string>(l.names.begin() + static_cast<std::ptrdiff_t>(l.n_params), l.names.end());
}

void TrainStep::save(const std::string& path, const TrainState& state) const {
  if (mesh_) return mesh_->save(path, state);
  for (const auto* group : {&state.params, &state.opt_state})
    for (const ShardedArray& a : *group)
      if (a.shards().size() != 1)
        throw Error("[TrainStep::save] the state does not belong to this step (make it with TrainStep::init)");
  detail::write_checkpoint(path, detail::checkpoint_layout(one_->store(), one_->optimizer()), gather_params(state),
                           gather_opt_state(state), state.step, "TrainStep");
}

TrainState TrainStep::load(const std::string& path) const {
  if (mesh_) return mesh_->load(path);
  detail::FullState full = detail::read_checkpoint(path, detail::checkpoint_layout(one_->store(), one_->optimizer()));
  TrainState s;
  for (const Array& a : full.params) s.params.push_back(whole(a, one_->replicated()));
  for (const Array& a : full.opt_state) s.opt_state.push_back(whole(a, one_->replicated()));
  s.step = full.step;
  return s;
}

const ShardingPlan& TrainStep::plan() const { return mesh_ ? mesh_->plan() : one_->plan(); }

std::string TrainStep::collectives_table() const {
  return mesh_ ? mesh_->collectives_table() : std::string("no collectives: the step runs on one device\n");
}

const Graph& TrainStep::graph() const { return mesh_ ? mesh_->graph() : one_->graph(); }

const Executable& TrainStep::executable() const {
  if (!one_) throw Error("[TrainStep] executable(): this step runs on a mesh; its program is sharded_executable()");
  return one_->executable();
}

const ShardedExecutable& TrainStep::sharded_executable() const {
  if (!mesh_) throw Error("[TrainStep] sharded_executable(): this step runs on one device; use executable()");
  return mesh_->executable();
}

ShardedExecutable& TrainStep::sharded_executable() {
  if (!mesh_) throw Error("[TrainStep] sharded_executable(): this step runs on one device; use executable()");
  return mesh_->executable();
}

int64_t TrainStep::peak_bytes() const {
  if (one_) return one_->executable().peak_bytes();
  int64_t peak = 0;
  for (int p : mesh_->executable().positions()) peak = std::max(peak, mesh_->executable().peak_bytes(p));
  return peak;
}

const optim::Optimizer& TrainStep::optimizer() const { return one_ ? one_->optimizer() : mesh_->optimizer(); }

const Sharding& TrainStep::batch_sharding(int i) const { return mesh_ ? mesh_->batch_sharding(i) : one_->replicated(); }

int64_t TrainStep::steps_run() const { return mesh_ ? mesh_->steps_run() : one_->steps_run(); }

int TrainStep::process() const { return mesh_ ? mesh_->process() : 0; }

// ---- ForwardFn ----------------------------------------------------------------------------------

ForwardFn::ForwardFn(nn::ParamStore& store, Fn fn, std::vector<TensorType> batch_types, ForwardOptions options) {
  if (!options.mesh) {
    auto g = nn::trace_with_params(store, fn, batch_types);
    exe_ = Executable::compile(*g, options.compile);
    return;
  }
  nn::ParamStore* s = &store;
  auto bound = [s, fn](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    nn::ParamBinding b = s->bind(params);
    return fn(args);
  };
  sharded_ = std::make_unique<ShardedFunction>(bound, store.types(), store.paths(), std::move(batch_types), options);
}

ForwardFn::~ForwardFn() = default;

std::vector<Array> ForwardFn::operator()(const std::vector<Array>& params, const std::vector<Array>& batch) {
  if (sharded_) return (*sharded_)(params, batch);
  std::vector<Array> in = params;
  in.insert(in.end(), batch.begin(), batch.end());
  return exe_->run(in);
}

const Executable& ForwardFn::executable() const {
  if (!exe_) throw Error("[ForwardFn] executable(): this function runs on a mesh; its program is sharded()");
  return *exe_;
}

const ShardedFunction& ForwardFn::sharded() const {
  if (!sharded_) throw Error("[ForwardFn] sharded(): this function runs on one device; use executable()");
  return *sharded_;
}

}  // namespace px
