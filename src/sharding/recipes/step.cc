// ShardedTrainStep, ShardedFunction / jit / create_sharded_model: trace once, place by the plan,
// partition and run through ShardedExecutable.
#include <algorithm>
#include <map>
#include <sstream>

#include "optim/checkpoint.h"
#include "parallax/autodiff.h"
#include "parallax/nn.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"

namespace px {
namespace {

// The spec a param has while it is used: its stored spec without the batch (FSDP) axes.
PartitionSpec use_spec(const PartitionSpec& s, const std::vector<std::string>& batch_axes) {
  std::vector<PartitionSpec::Dim> dims;
  for (const auto& d : s.dims()) {
    std::vector<std::string> keep;
    for (const auto& a : d.axes)
      if (std::find(batch_axes.begin(), batch_axes.end(), a) == batch_axes.end()) keep.push_back(a);
    dims.emplace_back(std::move(keep));
  }
  return PartitionSpec(std::move(dims));
}

// The batch's leading dim split over the batch axes when it divides; otherwise replicated.
PartitionSpec batch_spec(const TensorType& t, const Mesh& mesh, const std::vector<std::string>& axes) {
  if (t.rank() == 0 || axes.empty()) return {};
  int64_t n = 1;
  for (auto& a : axes) n *= mesh.axis_size(a);
  if (t.shape[0] % n != 0) return {};
  return PartitionSpec{PartitionSpec::Dim(axes)};
}

// Params as the model sees them: all-gathered over the batch axes when stored FSDP-split.
std::vector<Tensor> gathered_params(const std::vector<Tensor>& params, const ShardingPlan& plan) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < params.size(); ++i) {
    PartitionSpec u = use_spec(plan.params[i].spec, plan.batch_axes);
    out.push_back(u == plan.params[i].spec ? params[i] : with_sharding_constraint(params[i], u));
  }
  return out;
}

int64_t local_bytes(const TensorType& t) { return numel(t.shape) * dtype_size(t.dtype); }

// Pins each gradient to its param's spec right after autodiff: one all-reduce (replicated) or
// reduce-scatter (FSDP) that the norm and the update share. Replicated gradients of one dtype are
// flattened into buckets and all-reduced together (concat of partial sums stays partial).
std::vector<Tensor> pin_gradients(std::vector<Tensor> grads, const ShardingPlan& plan, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::map<DType, size_t> open;  // dtype -> index of its open bucket
  std::vector<int64_t> fill;
  for (size_t i = 0; i < grads.size(); ++i) {
    const PartitionSpec& spec = plan.params[i].spec;
    if (bucket_bytes <= 0 || !spec.is_replicated()) {
      grads[i] = with_sharding_constraint(grads[i], spec);
      continue;
    }
    int64_t b = grads[i].type().nbytes();
    auto it = open.find(grads[i].dtype());
    if (it == open.end() || fill[it->second] + b > bucket_bytes) {
      open[grads[i].dtype()] = buckets.size();
      buckets.push_back({});
      fill.push_back(0);
      it = open.find(grads[i].dtype());
    }
    buckets[it->second].push_back(i);
    fill[it->second] += b;
  }
  for (const auto& bucket : buckets) {
    if (bucket.size() == 1) {
      grads[bucket[0]] = with_sharding_constraint(grads[bucket[0]], PartitionSpec());
      continue;
    }
    std::vector<Tensor> flat;
    for (size_t i : bucket) flat.push_back(reshape(grads[i], {grads[i].numel()}));
    Tensor all = with_sharding_constraint(concat(flat, 0), PartitionSpec());
    int64_t off = 0;
    for (size_t i : bucket) {
      int64_t n = grads[i].numel();
      grads[i] = reshape(slice_axis(all, 0, off, off + n), grads[i].shape());
      off += n;
    }
  }
  return grads;
}

}  // namespace

ShardedTrainStep::ShardedTrainStep(nn::ParamStore& store, optim::OptimizerPtr opt, LossFn loss_fn,
                                   std::vector<TensorType> batch_types, Mesh mesh, ShardingStrategy strategy,
                                   ShardingOptions sharding, TrainStepOptions options)
    : store_(store), opt_(std::move(opt)), batch_types_(std::move(batch_types)), mesh_(std::move(mesh)) {
  if (!opt_) throw Error("[ShardedTrainStep] no optimizer given");
  std::vector<std::string> paths = store_.paths();
  if (strategy == ShardingStrategy::AUTO)
    throw Error("[sharding] AUTO sharding is not available yet; use DDP, FSDP, TP, FSDP_TP or MANUAL");
  // The forward program tells TP which matmul consumes which param.
  auto fwd = nn::trace_with_params(
      store_, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss_fn(b)}; }, batch_types_);
  plan_ = plan_sharding(*fwd, paths, mesh_, strategy, sharding);

  std::vector<TensorType> param_types = store_.types();
  std::vector<optim::StateSlot> slots = opt_->state_slots(param_types);
  n_params_ = param_types.size();
  n_state_ = slots.size();
  for (const auto& s : slots)
    state_specs_.push_back(s.type.shape == param_types[s.param].shape ? plan_.params[s.param].spec : PartitionSpec());

  int64_t bucket_bytes = sharding.bucket_bytes;
  if (bucket_bytes < 0) {
    double latency = 0;
    for (const auto& a : plan_.batch_axes) latency = std::max(latency, mesh_.axes()[mesh_.axis_index(a)].link.latency_s);
    bucket_bytes = latency >= 10e-6 ? int64_t{25} << 20 : 0;
  }
  // FSDP: all-gather before use; the gradients w.r.t. the gathered params are partial sums over
  // the batch axes, pinned to their stored layout (and DDP's bucketed) before the update.
  StepHooks hooks;
  hooks.use = [&](const std::vector<Tensor>& params) { return gathered_params(params, plan_); };
  hooks.pin = [&](std::vector<Tensor> grads) { return pin_gradients(std::move(grads), plan_, bucket_bytes); };
  graph_ = trace_train_step(store_, *opt_, loss_fn, batch_types_, options.clip_norm, hooks, "ShardedTrainStep");

  std::vector<PartitionSpec> in_specs;
  PartitionOptions popt;
  for (int k = 0; k < 3; ++k) popt.out_shardings.push_back(Sharding::replicated(mesh_));
  for (const auto& p : plan_.params) {
    in_specs.push_back(p.spec);
    popt.out_shardings.push_back(Sharding(mesh_, p.spec));
  }
  for (const auto& s : state_specs_) {
    in_specs.push_back(s);
    popt.out_shardings.push_back(Sharding(mesh_, s));
  }
  for (const auto& t : batch_types_) in_specs.push_back(batch_spec(t, mesh_, plan_.batch_axes));
  in_specs.push_back({});
  exe_ = ShardedExecutable::compile(*graph_, mesh_, in_specs, popt, options.compile, sharding.device_parallelism);
}

ShardedTrainStep::~ShardedTrainStep() = default;

ShardedTrainState ShardedTrainStep::init(uint64_t seed) const { return init(store_.init(seed)); }

ShardedTrainState ShardedTrainStep::init(const std::vector<Array>& params) const {
  if (params.size() != n_params_)
    throw Error("[ShardedTrainStep] got " + std::to_string(params.size()) + " params, the model has " +
                std::to_string(n_params_));
  std::vector<Array> st = opt_->init_state(params);
  ShardedTrainState s;
  for (size_t i = 0; i < n_params_; ++i) s.params.push_back(shard(params[i], exe_->in_sharding(static_cast<int>(i))));
  for (size_t i = 0; i < n_state_; ++i)
    s.opt_state.push_back(shard(st[i], exe_->in_sharding(static_cast<int>(n_params_ + i))));
  return s;
}

const Sharding& ShardedTrainStep::batch_sharding(int i) const {
  return exe_->in_sharding(static_cast<int>(n_params_ + n_state_) + i);
}

StepMetrics ShardedTrainStep::operator()(ShardedTrainState& state, const std::vector<Array>& batch) {
  if (state.params.size() != n_params_ || state.opt_state.size() != n_state_)
    throw Error("[ShardedTrainStep] the state does not belong to this step (make it with ShardedTrainStep::init)");
  if (batch.size() != batch_types_.size())
    throw Error("[ShardedTrainStep] expected " + std::to_string(batch_types_.size()) + " batch arrays, got " +
                std::to_string(batch.size()));
  std::vector<ShardedArray> in;
  in.reserve(n_params_ + n_state_ + batch.size() + 1);
  for (auto& p : state.params) in.push_back(p);
  for (auto& s : state.opt_state) in.push_back(s);
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].type() != batch_types_[i])
      throw Error("[ShardedTrainStep] batch array " + std::to_string(i) + " has type " + type_str(batch[i].type()) +
                  ", the step was traced for " + type_str(batch_types_[i]));
    in.push_back(shard(batch[i], batch_sharding(static_cast<int>(i))));
  }
  Array step = Array::from_i32({static_cast<int32_t>(state.step)}, {});
  in.push_back(shard(step, exe_->in_sharding(static_cast<int>(in.size()))));
  // Double buffering: outputs land in the buffers of the state before last, then swap in.
  std::vector<ShardedArray>& out = out_;
  exe_->run_into(in, out);
  StepMetrics m;
  m.loss = out[0].shard(0).to_f32()[0];
  m.grad_norm = out[1].shard(0).to_f32()[0];
  m.lr = out[2].shard(0).to_f32()[0];
  for (size_t i = 0; i < n_params_; ++i) std::swap(state.params[i], out[3 + i]);
  for (size_t i = 0; i < n_state_; ++i) std::swap(state.opt_state[i], out[3 + n_params_ + i]);
  ++state.step;
  ++steps_run_;
  return m;
}

std::vector<Array> ShardedTrainStep::gather_params(const ShardedTrainState& s) const {
  std::vector<Array> out;
  for (const auto& p : s.params) out.push_back(gather(p));
  return out;
}

std::vector<Array> ShardedTrainStep::gather_opt_state(const ShardedTrainState& s) const {
  std::vector<Array> out;
  for (const auto& p : s.opt_state) out.push_back(gather(p));
  return out;
}

void ShardedTrainStep::save(const std::string& path, const ShardedTrainState& state) const {
  // write_checkpoint rejects a state of another step (counts or types) with the caller's name.
  detail::write_checkpoint(path, detail::checkpoint_layout(store_, *opt_), gather_params(state),
                           gather_opt_state(state), state.step, "ShardedTrainStep");
}

ShardedTrainState ShardedTrainStep::load(const std::string& path) const {
  TrainState full = detail::read_checkpoint(path, detail::checkpoint_layout(store_, *opt_));
  ShardedTrainState s;
  // Each full array is dropped once sharded, so the full and the sharded state never both exist whole.
  for (size_t i = 0; i < n_params_; ++i) {
    s.params.push_back(shard(full.params[i], exe_->in_sharding(static_cast<int>(i))));
    full.params[i] = Array();
  }
  for (size_t i = 0; i < n_state_; ++i) {
    s.opt_state.push_back(shard(full.opt_state[i], exe_->in_sharding(static_cast<int>(n_params_ + i))));
    full.opt_state[i] = Array();
  }
  s.step = full.step;
  return s;
}

std::string ShardedTrainStep::collectives_table() const {
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
    r.bytes += local_bytes(c.kind == "all_gather" ? c.result : c.operand);
  }
  os << "planned collectives per step (payload bytes per device):\n";
  for (const auto& [k, r] : planned) os << "  " << k << ": " << r.count << " calls, " << r.bytes << " bytes\n";
  const CollectiveStats& st = exe_->stats();
  const int64_t steps = std::max<int64_t>(steps_run_, 1), devices = std::max<int64_t>(mesh_.size(), 1);
  os << "counted at run time, per step and device (over " << steps_run_ << " steps):\n";
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

ShardedFunction::ShardedFunction(Fn fn, std::vector<TensorType> param_types, std::vector<std::string> param_paths,
                                 std::vector<TensorType> arg_types, Mesh mesh, ShardingStrategy strategy,
                                 ShardingOptions options) {
  if (param_paths.empty())
    for (size_t i = 0; i < param_types.size(); ++i) param_paths.push_back("param." + std::to_string(i));
  if (param_paths.size() != param_types.size())
    throw Error("[jit] " + std::to_string(param_paths.size()) + " param paths for " +
                std::to_string(param_types.size()) + " params");
  if (strategy == ShardingStrategy::AUTO)
    throw Error("[sharding] AUTO sharding is not available yet; use DDP, FSDP, TP, FSDP_TP or MANUAL");
  const size_t np = param_types.size();
  std::vector<TensorType> types = param_types;
  types.insert(types.end(), arg_types.begin(), arg_types.end());
  std::vector<std::string> names = param_paths;
  for (size_t i = 0; i < arg_types.size(); ++i) names.push_back("arg." + std::to_string(i));
  auto split = [np](const std::vector<Tensor>& in) {
    return std::make_pair(std::vector<Tensor>(in.begin(), in.begin() + np),
                          std::vector<Tensor>(in.begin() + np, in.end()));
  };
  auto plain = trace(
      [&](const std::vector<Tensor>& in) {
        auto [p, a] = split(in);
        return fn(p, a);
      },
      types, names);
  plan_ = plan_sharding(*plain, param_paths, mesh, strategy, options);
  graph_ = trace(
      [&](const std::vector<Tensor>& in) {
        auto [p, a] = split(in);
        return fn(gathered_params(p, plan_), a);
      },
      types, names);
  std::vector<PartitionSpec> specs;
  for (const auto& p : plan_.params) specs.push_back(p.spec);
  for (const auto& t : arg_types) specs.push_back(batch_spec(t, mesh, plan_.batch_axes));
  exe_ = ShardedExecutable::compile(*graph_, mesh, specs);
}

ShardedFunction::~ShardedFunction() = default;

std::vector<Array> ShardedFunction::operator()(const std::vector<Array>& params, const std::vector<Array>& args) {
  std::vector<Array> in = params;
  in.insert(in.end(), args.begin(), args.end());
  return exe_->run_full(in);
}

std::unique_ptr<ShardedFunction> jit(ShardedFunction::Fn fn, ShardingStrategy strategy,
                                     const std::vector<TensorType>& param_types,
                                     const std::vector<std::string>& param_paths,
                                     const std::vector<TensorType>& arg_types, const Mesh& mesh,
                                     const ShardingOptions& options) {
  return std::make_unique<ShardedFunction>(std::move(fn), param_types, param_paths, arg_types, mesh, strategy, options);
}

std::unique_ptr<ShardedFunction> create_sharded_model(
    nn::ParamStore& store, const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& model_fn,
    const std::vector<TensorType>& sample_types, const Mesh& mesh, ShardingStrategy strategy,
    const ShardingOptions& options) {
  nn::ParamStore* s = &store;
  auto fn = [s, model_fn](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    nn::ParamBinding b = s->bind(params);
    return model_fn(args);
  };
  return jit(fn, strategy, store.types(), store.paths(), sample_types, mesh, options);
}

}  // namespace px
