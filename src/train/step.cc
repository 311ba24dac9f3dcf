// A training step, on one device as on any mesh, pipelined or not: the staged programs that
// compile_step made, run by their runner (pipeline_step.cc) over this process's shards of params,
// optimizer state and batch.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <sstream>

#include "checkpoint/layout.h"
#include "core/exclusive.h"
#include "runtime/program.h"
#include "train/pipeline_step.h"
#include "train/steps.h"

namespace px::detail {

int32_t traced_step(int64_t step, const std::string& who) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() - 1;
  if (step < 0 || step > kMax)
    throw UserError("[" + who + "] the state's step is " + std::to_string(step) + "; it must be in [0, " +
                    std::to_string(kMax) +
                    "] (the traced step counter is i32 and the update uses step + 1); start from a state with a "
                    "smaller step");
  return static_cast<int32_t>(step);
}

StepMetrics step_metrics(float loss, float grad_norm, float lr, bool skip) {
  StepMetrics m;
  m.loss = loss;
  m.grad_norm = grad_norm;
  m.lr = lr;
  m.finite = std::isfinite(loss) && std::isfinite(grad_norm);
  m.skipped = skip && !m.finite;
  return m;
}

Step::Step(nn::ParamStore& store, optim::OptimizerPtr opt, TrainStep::LossFn loss_fn,
           std::vector<TensorType> batch_types, const TrainStepOptions& options)
    : store_(store), opt_(std::move(opt)), batch_types_(std::move(batch_types)) {
  c_ = compile_step(store_, *opt_, loss_fn, batch_types_, options);
  skip_nonfinite_ = options.skip_nonfinite;
}

TrainState Step::begin_state() const {
  TrainState s;
  s.params.resize(c_.n_params);
  s.opt_state.resize(c_.n_state);
  return s;
}

MemoryKind Step::input_kind(size_t i) const { return c_.runner->state_kind(i); }

// Input `i`'s shards moved to the memory kind the step keeps it in (offload: pinned_host) now, one
// param at a time, so that a model whose state only fits offloaded can be initialized.
ShardedArray Step::placed(ShardedArray a, size_t i) const {
  const MemoryKind want = input_kind(i);
  for (Array& sh : a.mutable_shards())
    if (sh.placement().kind != want) sh = sh.to({sh.placement().device, want});
  return a;
}

// State input i whole (over several processes a collective: every process calls it in turn).
Array Step::gathered(size_t i, const ShardedArray& a) const { return c_.runner->gather_state(i, a); }

void Step::set_param(TrainState& s, int i, const Array& full) const {
  check_param(s, i, full.type());
  const int proc = c_.process;
  s.params[i] = placed(shard(full, c_.in_shardings[i], proc), i);
  // Its optimizer slots, fresh: the optimizer's state for this param alone, in slot order.
  std::vector<Array> st = opt_->init_state({full});
  size_t k = 0;
  const std::vector<optim::StateSlot> slots = opt_->state_slots(store_.types());
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].param == i) {
      if (k >= st.size()) throw InternalError("[TrainStep] set_param: optimizer slots do not line up");
      s.opt_state[j] = placed(shard(st[k++], c_.in_shardings[c_.n_params + j], proc), c_.n_params + j);
    }
}

void Step::set_param(TrainState& s, int i, const BoxReader& read) const {
  const std::vector<TensorType> types = store_.types();
  check_param(s, i, i >= 0 && static_cast<size_t>(i) < types.size() ? types[i] : TensorType{});
  const int proc = c_.process;
  s.params[i] = placed(shard(types[i], read, c_.in_shardings[i], proc), i);
  auto zeros = [](const std::vector<int64_t>&, Array& out) {
    if (out.nbytes()) std::memset(out.raw(), 0, static_cast<size_t>(out.nbytes()));
  };
  const std::vector<optim::StateSlot> slots = opt_->state_slots(types);
  for (size_t j = 0; j < slots.size(); ++j)
    if (slots[j].param == i)
      s.opt_state[j] = placed(shard(slots[j].type, zeros, c_.in_shardings[c_.n_params + j], proc), c_.n_params + j);
}

void Step::check_param(const TrainState& s, int i, const TensorType& type) const {
  if (s.params.size() != c_.n_params || s.opt_state.size() != c_.n_state)
    throw Error("[TrainStep] set_param: the state does not belong to this step (make it with begin_state)");
  if (i < 0 || static_cast<size_t>(i) >= c_.n_params)
    throw Error("[TrainStep] set_param: param index " + std::to_string(i) + " is outside [0, " +
                std::to_string(c_.n_params) + ")");
  const TensorType want = store_.types()[i];
  if (type != want)
    throw Error("[TrainStep] set_param: param '" + store_.paths()[i] + "' is " + type_str(want) + ", got " +
                type_str(type));
}

const Sharding& Step::batch_sharding(int i) const {
  return c_.in_shardings.at(c_.n_params + c_.n_state + static_cast<size_t>(i));
}

StepMetrics Step::operator()(TrainState& state, const std::vector<Array>& batch) {
  ExclusiveCall call(busy_, "training step");  // out_ is reused by every call
  if (state.params.size() != c_.n_params || state.opt_state.size() != c_.n_state)
    throw Error("[TrainStep] the state does not belong to this step (make it with TrainStep::init)");
  for (size_t i = 0; i < c_.n_params; ++i) {
    const ShardedArray& p = state.params[i];
    const Mesh& mesh = c_.in_shardings[i].mesh;  // a pipeline's: the param's stage's devices
    if (p.shards().empty() && !p.positions().empty())
      throw Error("[TrainStep] param '" + store_.paths()[i] +
                  "' was never set: give every param with set_param (or make the state with init)");
    if (p.mesh() != mesh)
      throw Error("[TrainStep] param '" + store_.paths()[i] + "' is split over " + p.mesh().to_string() +
                  " but this step runs on " + mesh.to_string() +
                  ": save the state and load it here, or give the step the state's mesh (TrainStepOptions::mesh)");
  }
  for (size_t j = 0; j < c_.n_state; ++j) {
    const Mesh& mesh = c_.in_shardings[c_.n_params + j].mesh;
    if (state.opt_state[j].mesh() != mesh)
      throw Error("[TrainStep] the optimizer state is on " + state.opt_state[j].mesh().to_string() +
                  ", not on this step's " + mesh.to_string() +
                  ": make the state with this step's init (or load a saved one)");
  }
  if (batch.size() != batch_types_.size())
    throw Error("[TrainStep] expected " + std::to_string(batch_types_.size()) + " batch arrays, got " +
                std::to_string(batch.size()));
  for (size_t i = 0; i < batch.size(); ++i)
    if (batch[i].type() != batch_types_[i])
      throw Error("[TrainStep] batch array " + std::to_string(i) + " has type " + type_str(batch[i].type()) +
                  ", the step was traced for " + type_str(batch_types_[i]));
  check_indices(c_.index_uses, c_.n_params + c_.n_state, batch);
  // Params and state live where the step keeps them (offload: pinned_host); moved there once.
  size_t k = 0;
  for (auto* group : {&state.params, &state.opt_state})
    for (ShardedArray& a : *group) {
      const MemoryKind want = input_kind(k++);
      for (Array& sh : a.mutable_shards())
        if (sh.placement().kind != want) sh = sh.to({sh.placement().device, want});
    }
  // The new params and state are written into the arrays of the old ones, in place (the plan counts
  // them once), unless someone else also holds them (a copy of the TrainState): then the new values
  // go to new arrays and the copy keeps the old ones.
  std::vector<char> donate;
  std::vector<ShardedArray> in;
  in.reserve(c_.n_params + c_.n_state);
  for (auto* group : {&state.params, &state.opt_state})
    for (const ShardedArray& a : *group) {
      bool sole = true;
      for (const Array& sh : a.shards()) sole = sole && sh.sole_owner();
      donate.push_back(sole);
      in.push_back(a);
    }
  PipelineRunner::Outputs out =
      c_.runner->run(in, donate, Array::from_i32({traced_step(state.step, "TrainStep")}, {}), batch);
  in.clear();
  const StepMetrics m =
      step_metrics(out.loss.to_f32()[0], out.grad_norm.to_f32()[0], out.lr.to_f32()[0], skip_nonfinite_);
  for (size_t i = 0; i < c_.n_params; ++i) state.params[i] = std::move(out.state[i]);
  for (size_t i = 0; i < c_.n_state; ++i) state.opt_state[i] = std::move(out.state[c_.n_params + i]);
  count(state, m);
  return m;
}

void Step::count(TrainState& state, const StepMetrics& m) {
  if (m.skipped)
    ++state.skipped;
  else
    ++state.step;
  ++steps_run_;
}

int64_t Step::peak_bytes() const { return c_.runner->planned_peak(); }

bool Step::pipelined() const { return pipeline::has_stage_axis(c_.plan.mesh); }

const PipelineReport& Step::pipeline_report() const { return c_.runner->report(); }

int Step::num_programs() const { return static_cast<int>(c_.runner->programs().size()); }

ShardedExecutable& Step::program(int i) const {
  if (i < 0 || i >= num_programs())
    throw UserError("[TrainStep] program " + std::to_string(i) + " is not one of the step's " +
                    std::to_string(num_programs()) + " (0 .. num_programs() - 1)");
  return *c_.runner->programs()[static_cast<size_t>(i)];
}

std::vector<Array> Step::gather_params(const TrainState& s) const {
  std::vector<Array> out;
  for (size_t i = 0; i < s.params.size(); ++i) out.push_back(gathered(i, s.params[i]));
  return out;
}

std::vector<Array> Step::gather_opt_state(const TrainState& s) const {
  std::vector<Array> out;
  for (size_t i = 0; i < s.opt_state.size(); ++i) out.push_back(gathered(c_.n_params + i, s.opt_state[i]));
  return out;
}

int Step::rank() const { return c_.process; }

Communicator* Step::communicator() const { return c_.comm; }

ckpt::StateLayout Step::layout() const {
  ckpt::StateLayout l;
  l.names = store_.paths();
  l.types = store_.types();
  l.n_params = l.names.size();
  l.optimizer = opt_->name();
  const std::vector<std::string> paths = l.names;
  for (const optim::StateSlot& s : opt_->state_slots(l.types)) {
    l.names.push_back(paths[s.param] + "." + s.name);
    l.types.push_back(s.type);
  }
  return l;
}

Checkpoint Step::checkpoint(const TrainState& state, const std::string& who) const {
  const ckpt::StateLayout l = layout();
  if (state.params.size() != c_.n_params || state.opt_state.size() != c_.n_state)
    throw Error("[" + who + "] the state does not belong to this step (make it with TrainStep::init)");
  Checkpoint c(state.step);
  c.optimizer = l.optimizer;
  for (size_t i = 0; i < l.names.size(); ++i) {
    const bool param = i < c_.n_params;
    const ShardedArray& a = param ? state.params[i] : state.opt_state[i - c_.n_params];
    if (a.shards().empty() && !a.positions().empty())
      throw Error("[" + who + "] the state's tensor '" + l.names[i] +
                  "' was never set: give every param with set_param (or make the state with TrainStep::init)");
    if (a.type() != l.types[i])
      throw Error("[" + who + "] the state's tensor '" + l.names[i] + "' is " + type_str(a.type()) +
                  " but this step has " + type_str(l.types[i]) +
                  "; the state does not belong to this step (make it with TrainStep::init)");
  }
  // Each process's own shards (a pipeline's: those of its stages).
  for (size_t i = 0; i < l.names.size(); ++i) {
    const bool param = i < c_.n_params;
    c.add(l.names[i], param ? state.params[i] : state.opt_state[i - c_.n_params],
          param ? ckpt::kParamsGroup : ckpt::kOptStateGroup);
  }
  return c;
}

RestoreOptions Step::restore_options() const {
  RestoreOptions o;
  const ckpt::StateLayout l = layout();
  for (size_t i = 0; i < l.names.size(); ++i) o.shardings[l.names[i]] = c_.in_shardings.at(i);
  o.process = c_.process;
  return o;
}

TrainState Step::restore(Checkpoint c, const std::string& where) const {
  const ckpt::StateLayout l = layout();
  ckpt::check_state(ckpt::array_infos(c), c.optimizer, l, where);
  try {
    traced_step(c.step, "TrainStep::load");
  } catch (const UserError& e) {
    throw UserError(where + ": " + e.what());
  }
  std::map<std::string, size_t> index;
  for (size_t k = 0; k < c.entries.size(); ++k) index[c.entries[k].name] = k;
  const int proc = c_.process;
  TrainState s;
  s.step = c.step;
  for (size_t i = 0; i < l.names.size(); ++i) {
    ShardedArray& a = c.entries[index.at(l.names[i])].array;
    const Sharding& want = c_.in_shardings.at(i);
    ShardedArray got;
    if (a.sharding() == want && a.process() == proc) {
      got = std::move(a);
    } else if (a.mesh().size() == 1 && a.sharding().partial.empty()) {
      got = shard(a.shards()[0], want, proc);  // a whole array: split here, then dropped
      a = ShardedArray();
    } else {
      throw UserError(where + ": tensor '" + l.names[i] + "' is split as " + a.sharding().to_string() +
                      " but this step holds it as " + want.to_string() +
                      "; read the checkpoint with TrainStep::restore_options() (or load it with TrainStep::load)");
    }
    (i < c_.n_params ? s.params : s.opt_state).push_back(std::move(got));
  }
  return s;
}

namespace {

bool is_safetensors(const std::string& path) { return path.ends_with(".safetensors"); }

// A checkpoint directory, or the newest committed one in a directory of them (a manager's or
// pax's JOB_DIR/checkpoints).
std::string checkpoint_dir(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(path, ec))
    throw UserError("[TrainStep::load] " + path +
                    " is a file, not a checkpoint directory; TrainStep::save writes a directory, and a single "
                    "safetensors file (save's export) loads from a path ending in \".safetensors\"");
  if (fs::is_directory(path, ec) && !ckpt::is_committed(path)) {
    const std::vector<int64_t> steps = ckpt::committed_steps(path);
    if (!steps.empty()) return path + "/" + ckpt::step_dir_name(steps.back());
  }
  return path;  // read_checkpoint_info says what is wrong with it
}

}  // namespace

void Step::save(const std::string& path, const TrainState& state) const {
  Checkpoint c = checkpoint(state, "TrainStep::save");
  const bool several = c_.plan.mesh.num_processes() > 1;
  if (is_safetensors(path)) {
    // An export: full arrays, gathered (collectives over several processes); process 0 writes.
    Checkpoint full(c.step);
    full.optimizer = c.optimizer;
    for (size_t i = 0; i < c.entries.size(); ++i)
      full.add(c.entries[i].name, gathered(i, c.entries[i].array), c.entries[i].group);
    if (rank() == 0) export_safetensors(full, path, /*group=*/"");
  } else {
    CheckpointOptions o;
    o.processes.index = rank();
    if (several) o.processes.barrier = [this](const std::string&) { communicator()->barrier(); };
    write_checkpoint(path, c, o);
  }
  // Nobody returns before the checkpoint is committed (a load right after sees it).
  if (several) communicator()->barrier();
}

TrainState Step::load(const std::string& path) const {
  if (is_safetensors(path)) return restore(import_safetensors(path), path);
  const std::string dir = checkpoint_dir(path);
  // Names, types and optimizer from the metadata first: a checkpoint of another model fails here
  // naming the tensor, before any chunk is read.
  CheckpointInfo info = read_checkpoint_info(dir);
  ckpt::check_state(info.arrays, info.optimizer, layout(), dir);
  return restore(read_checkpoint(dir, restore_options()), dir);
}

std::string Step::collectives_table() const { return c_.runner->collectives_table(); }

}  // namespace px::detail
