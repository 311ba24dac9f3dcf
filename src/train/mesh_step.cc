// TrainStep on a mesh: the step decided by a recipe or AUTO (decide_sharded_step), partitioned
// and run by a ShardedExecutable over this process's shards.
#include <cstring>
#include <map>
#include <sstream>

#include "core/exclusive.h"
#include "optim/checkpoint.h"
#include "runtime/program.h"
#include "sharding/recipes/step.h"
#include "train/steps.h"

namespace px::detail {

MeshStep::MeshStep(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn,
                   std::vector<TensorType> batch_types, const TrainStepOptions& options)
    : store_(store), opt_(std::move(opt)), batch_types_(std::move(batch_types)), mesh_(*options.mesh) {
  const ShardingStrategy strategy = options.strategy;
  const ShardingOptions& sharding = options.sharding;
  DecidedStep d = decide_sharded_step(store_, *opt_, loss_fn, batch_types_, mesh_, strategy, sharding, options);
  plan_ = std::move(d.plan);
  state_specs_ = std::move(d.state_specs);
  n_params_ = d.program.n_params;
  n_state_ = d.program.n_state;
  skip_nonfinite_ = options.skip_nonfinite;
  graph_ = std::move(d.program.graph);
  SpmdProgram local = partition(*graph_, d.decision, d.program.categories);
  CompileOptions copt = options.compile;
  offload_local(local, d.program, options.offload, copt);
  exe_ = ShardedExecutable::compile(std::move(local), copt, sharding.device_parallelism, sharding.communicator);
}

TrainState MeshStep::begin_state() const {
  TrainState s;
  s.params.resize(n_params_);
  s.opt_state.resize(n_state_);
  return s;
}

void MeshStep::set_param(TrainState& s, int i, const Array& full) const {
  check_param(s, i, full.type());
  const int proc = exe_->process();
  s.params[i] = shard(full, exe_->in_sharding(i), proc);
  // Its optimizer slots, fresh: the optimizer's state for this param alone, in slot order.
  std::vector<Array> st = opt_->init_state({full});
  size_t k = 0;
  const std::vector<optim::StateSlot> slots = opt_->state_slots(store_.types());
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].param == i) {
      if (k >= st.size()) throw InternalError("[TrainStep] set_param: optimizer slots do not line up");
      s.opt_state[j] = shard(st[k++], exe_->in_sharding(static_cast<int>(n_params_ + j)), proc);
    }
}

void MeshStep::set_param(TrainState& s, int i, const BoxReader& read) const {
  const std::vector<TensorType> types = store_.types();
  check_param(s, i, i >= 0 && static_cast<size_t>(i) < types.size() ? types[i] : TensorType{});
  const int proc = exe_->process();
  s.params[i] = shard(types[i], read, exe_->in_sharding(i), proc);
  auto zeros = [](const std::vector<int64_t>&, Array& out) {
    if (out.nbytes()) std::memset(out.raw(), 0, static_cast<size_t>(out.nbytes()));
  };
  const std::vector<optim::StateSlot> slots = opt_->state_slots(types);
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].param == i)
      s.opt_state[j] = shard(slots[j].type, zeros, exe_->in_sharding(static_cast<int>(n_params_ + j)), proc);
}

void MeshStep::check_param(const TrainState& s, int i, const TensorType& type) const {
  if (s.params.size() != n_params_ || s.opt_state.size() != n_state_)
    throw Error("[TrainStep] set_param: the state does not belong to this step (make it with begin_state)");
  if (i < 0 || static_cast<size_t>(i) >= n_params_)
    throw Error("[TrainStep] set_param: param index " + std::to_string(i) + " is outside [0, " +
                std::to_string(n_params_) + ")");
  const TensorType want = store_.types()[i];
  if (type != want)
    throw Error("[TrainStep] set_param: param '" + store_.paths()[i] + "' is " + type_str(want) + ", got " +
                type_str(type));
}

const Sharding& MeshStep::batch_sharding(int i) const {
  return exe_->in_sharding(static_cast<int>(n_params_ + n_state_) + i);
}

StepMetrics MeshStep::operator()(TrainState& state, const std::vector<Array>& batch) {
  ExclusiveCall call(busy_, "training step");  // out_ is reused by every call
  if (state.params.size() != n_params_ || state.opt_state.size() != n_state_)
    throw Error("[TrainStep] the state does not belong to this step (make it with MeshStep::init)");
  for (size_t i = 0; i < n_params_; ++i)
    if (state.params[i].shards().empty())
      throw Error("[TrainStep] param '" + store_.paths()[i] +
                  "' was never set: give every param with set_param (or make the state with init)");
  if (batch.size() != batch_types_.size())
    throw Error("[TrainStep] expected " + std::to_string(batch_types_.size()) + " batch arrays, got " +
                std::to_string(batch.size()));
  // Params and state live where the step keeps them (offload: pinned_host); moved there once.
  size_t k = 0;
  for (auto* group : {&state.params, &state.opt_state})
    for (ShardedArray& a : *group) {
      const MemoryKind want = exe_->executable().input_kind(static_cast<int>(k++));
      for (Array& sh : a.mutable_shards())
        if (sh.placement().kind != want) sh = sh.to({sh.placement().device, want});
    }
  std::vector<ShardedArray> in;
  in.reserve(n_params_ + n_state_ + batch.size() + 1);
  for (auto& p : state.params) in.push_back(p);
  for (auto& s : state.opt_state) in.push_back(s);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].type() != batch_types_[i])
      throw Error("[TrainStep] batch array " + std::to_string(i) + " has type " + type_str(batch[i].type()) +
                  ", the step was traced for " + type_str(batch_types_[i]));
    in.push_back(shard(batch[i], batch_sharding(static_cast<int>(i)), exe_->process()));
  }
  Array step = Array::from_i32({traced_step(state.step, "TrainStep")}, {});
  in.push_back(shard(step, exe_->in_sharding(static_cast<int>(in.size())), exe_->process()));
  // Double buffering: outputs land in the buffers of the state before last, then swap in.
  std::vector<ShardedArray>& out = out_;
  exe_->run_into(in, out);
  // The metrics are replicated: any local shard holds them.
  StepMetrics m = step_metrics(out[0].shards()[0].to_f32()[0], out[1].shards()[0].to_f32()[0],
                               out[2].shards()[0].to_f32()[0], skip_nonfinite_);
  for (size_t i = 0; i < n_params_; ++i) std::swap(state.params[i], out[3 + i]);
  for (size_t i = 0; i < n_state_; ++i) std::swap(state.opt_state[i], out[3 + n_params_ + i]);
  if (m.skipped)
    ++state.skipped;
  else
    ++state.step;
  ++steps_run_;
  return m;
}

std::vector<Array> MeshStep::gather_params(const TrainState& s) const {
  std::vector<Array> out;
  for (const auto& p : s.params) out.push_back(gather(p, exe_->communicator()));
  return out;
}

std::vector<Array> MeshStep::gather_opt_state(const TrainState& s) const {
  std::vector<Array> out;
  for (const auto& p : s.opt_state) out.push_back(gather(p, exe_->communicator()));
  return out;
}

void MeshStep::save(const std::string& path, const TrainState& state) const {
  // write_checkpoint rejects a state of another step (counts or types) with the caller's name.
  // Over several processes the gathers are collectives; process 0 writes, and nobody returns
  // before the file is there (a load right after sees it).
  std::vector<Array> params = gather_params(state), opt_state = gather_opt_state(state);
  if (exe_->process() == 0)
    write_checkpoint(path, checkpoint_layout(store_, *opt_), params, opt_state, state.step, "TrainStep");
  if (mesh_.num_processes() > 1) exe_->communicator().barrier();
}

TrainState MeshStep::load(const std::string& path) const {
  FullState full = read_checkpoint(path, checkpoint_layout(store_, *opt_));
  TrainState s;
  // Each full array is dropped once sharded, so the full and the sharded state never both exist whole.
  for (size_t i = 0; i < n_params_; ++i) {
    s.params.push_back(shard(full.params[i], exe_->in_sharding(static_cast<int>(i)), exe_->process()));
    full.params[i] = Array();
  }
  for (size_t i = 0; i < n_state_; ++i) {
    s.opt_state.push_back(
        shard(full.opt_state[i], exe_->in_sharding(static_cast<int>(n_params_ + i)), exe_->process()));
    full.opt_state[i] = Array();
  }
  s.step = full.step;
  return s;
}

std::string MeshStep::collectives_table() const {
  std::ostringstream os;
  struct Row {
    int64_t count = 0, bytes = 0;
  };
  std::map<std::string, Row> planned;
  for (const CollectiveRecord& c : exe_->program().collectives) {
    if (c.kind == "local_slice") continue;
    std::string key = c.kind;
    for (size_t i = 0; i < c.axes.size(); ++i) key += (i ? "," : " over ") + c.axes[i];
    Row& r = planned[key];
    ++r.count;
    const TensorType& t = c.kind == "all_gather" ? c.result : c.operand;
    r.bytes += numel(t.shape) * dtype_size(t.dtype);
  }
  os << "planned collectives per step (payload bytes per device):\n";
  for (const auto& [k, r] : planned) os << "  " << k << ": " << r.count << " calls, " << r.bytes << " bytes\n";
  const CollectiveStats& st = exe_->stats();
  const int64_t steps = std::max<int64_t>(exe_->runs_counted(), 1);
  const int64_t devices = std::max<int64_t>(static_cast<int64_t>(exe_->positions().size()), 1);
  os << "counted at run time, per step and device (over " << exe_->runs_counted() << " steps):\n";
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    CollectiveStats::Entry e =
        st.per_device.empty() ? CollectiveStats::Entry{} : st.total(static_cast<CollectiveKind>(k));
    if (e.calls == 0) continue;
    os << "  " << collective_name(static_cast<CollectiveKind>(k)) << ": " << e.calls / (steps * devices)
       << " calls, payload " << e.payload_bytes / (steps * devices) << " bytes, wire "
       << e.wire_bytes / (steps * devices) << " bytes\n";
  }
  return os.str();
}

}  // namespace px::detail
