// The recipes' decision for a training step (decide_train_step, decide_sharded_step) and
// ShardedFunction / jit: trace once, place by the plan, partition and run through ShardedExecutable.
#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "core/exclusive.h"
#include "core/log.h"
#include "ir/primitive.h"
#include "memory/rewrite.h"
#include "ops/prims.h"
#include "parallax/autodiff.h"
#include "parallax/communicator.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "runtime/program.h"
#include "sharding/auto/solver.h"
#include "sharding/groups.h"
#include "sharding/recipes/step.h"

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

// The batch's leading dim split over the batch axes. A training batch that does not divide is an
// error (replicating it would run the whole batch on every device: N times the work, silently);
// a function argument that does not divide is replicated, with a warning.
PartitionSpec batch_spec(const TensorType& t, const Mesh& mesh, const std::vector<std::string>& axes, size_t index,
                         bool training) {
  if (t.rank() == 0 || axes.empty()) return {};
  int64_t n = 1;
  std::string names;
  for (auto& a : axes) {
    n *= mesh.axis_size(a);
    names += (names.empty() ? "" : ", ") + a;
  }
  if (t.shape[0] % n != 0) {
    std::string what = fmt::format(
        "{} {} has type {}: its leading dim {} does not divide over the batch axes ({}) "
        "of {} devices",
        training ? "batch array" : "argument", index, type_str(t), t.shape[0], names, n);
    if (training) throw UserError(fmt::format("[TrainStep] {}; use a batch that is a multiple of {}", what, n));
    PX_LOG(warn) << "[jit] " << what << "; it is replicated (every device computes all of it)";
    return {};
  }
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

int64_t axes_size(const Mesh& mesh, const std::vector<std::string>& axes) {
  int64_t n = 1;
  for (const auto& a : axes) n *= mesh.axis_size(a);
  return n;
}

// DDP buckets: replicated gradients of one dtype, in param order, up to bucket_bytes each.
std::vector<std::vector<int>> gradient_buckets(const StepProgram& p, const ShardingPlan& plan, int64_t bucket_bytes) {
  std::vector<std::vector<int>> buckets;
  if (bucket_bytes <= 0) return buckets;
  std::map<DType, size_t> open;  // dtype -> index of its open bucket
  std::vector<int64_t> fill;
  const std::vector<int> grads = p.grads();
  for (size_t i = 0; i < grads.size(); ++i) {
    if (!plan.params[i].spec.is_replicated()) continue;
    const TensorType& t = p.graph->type(grads[i]);
    auto it = open.find(t.dtype);
    if (it == open.end() || fill[it->second] + t.nbytes() > bucket_bytes) {
      open[t.dtype] = buckets.size();
      buckets.push_back({});
      fill.push_back(0);
      it = open.find(t.dtype);
    }
    buckets[it->second].push_back(grads[i]);
    fill[it->second] += t.nbytes();
  }
  return buckets;
}

// Sequence parallelism as Megatron runs it. Where a rule splits the tagged activations over an
// axis that also splits weights (the sequence over 'model'), a matmul between such a weight, split
// on a dim it does not contract, and an activation must see the activation whole over that axis:
// left to propagation, the larger activation would keep its sequence split and the weight would be
// gathered instead (a ZeRO-style gather of every tensor-parallel weight, and all-to-alls around
// it). So the activation is read gathered over the sequence (an all-gather; its gradient a
// reduce-scatter), once for the forward pass and once for the backward pass, as the weight
// gradient reads it too. The other side follows by propagation: the row-parallel output's partial
// sums are reduce-scattered onto the split sequence.
void sequence_parallel_gathers(const StepProgram& p, const ShardingPlan& plan,
                               const std::vector<std::pair<const PathRule*, int>>& matched,
                               std::vector<ValueConstraint>& out) {
  std::vector<std::string> sp_axes;  // axes of the rules that do not split the batch
  std::optional<PartitionSpec> whole;  // the first rule's layout with those axes left out
  int rank = 0;                        // of the value it applies to
  for (const auto& [r, r_rank] : matched) {
    std::vector<PartitionSpec::Dim> dims;
    for (const auto& dim : r->spec.dims()) {
      std::vector<std::string> keep;
      for (const auto& a : dim.axes)
        if (std::find(plan.batch_axes.begin(), plan.batch_axes.end(), a) != plan.batch_axes.end()) keep.push_back(a);
        else if (std::find(sp_axes.begin(), sp_axes.end(), a) == sp_axes.end()) sp_axes.push_back(a);
      dims.emplace_back(std::move(keep));
    }
    if (!whole) {
      whole = PartitionSpec(std::move(dims));
      rank = r_rank;
    }
  }
  if (sp_axes.empty()) return;
  const Graph& g = *p.graph;
  std::map<int, int> param_of;  // graph value -> param index
  for (size_t i = 0; i < plan.params.size(); ++i) param_of[g.inputs()[i]] = static_cast<int>(i);
  auto is_sp = [&](const std::string& a) { return std::find(sp_axes.begin(), sp_axes.end(), a) != sp_axes.end(); };
  auto on_sp_axis = [&](const PartitionSpec::Dim& dim) { return std::any_of(dim.axes.begin(), dim.axes.end(), is_sp); };
  // An embedding lookup from a table split over the vocabulary on such an axis: its rows come
  // whole over the sequence (each device the rows of its part of the vocabulary, summed), and its
  // gradient reads the output gradient gathered over the sequence, so that each device adds into
  // its own rows instead of into a whole table that is then reduce-scattered.
  std::set<int> lookup_indices;
  const int N = static_cast<int>(g.nodes().size());
  for (int n = 0; n < N; ++n) {
    if (!p.is_forward(n)) continue;
    const Node& node = g.nodes()[n];
    if (node.prim != prims::take() || node.inputs.size() != 2) continue;
    auto it = param_of.find(node.inputs[0]);
    if (it == param_of.end() || !on_sp_axis(plan.params[it->second].spec[0]) ||
        g.type(node.outputs[0]).rank() != rank)
      continue;
    out.push_back({node.outputs[0], *whole, -1, -1, false});
    lookup_indices.insert(node.inputs[1]);
  }
  for (int n = 0; n < N; ++n) {
    if (p.facts(n).phase != StepPhase::backward) continue;
    const Node& node = g.nodes()[n];
    if (node.prim == prims::scatter_add() && node.inputs.size() == 2 && lookup_indices.count(node.inputs[0]) &&
        g.type(node.inputs[1]).rank() == rank)
      out.push_back({node.inputs[1], *whole, n, n + 1, false});
  }
  std::set<std::pair<int, bool>> done;  // (activation, in the backward pass)
  for (int n = 0; n < N; ++n) {
    const NodeFacts& at = p.facts(n);
    if (at.phase != StepPhase::forward && at.phase != StepPhase::backward) continue;
    const Node& node = g.nodes()[n];
    if (node.prim != prims::dot_general() || node.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      auto it = param_of.find(node.inputs[side]);
      int act = node.inputs[1 - side];
      if (it == param_of.end() || param_of.count(act) || g.type(act).rank() != rank) continue;
      const PartitionSpec& ps = plan.params[it->second].spec;
      if (!std::any_of(ps.dims().begin(), ps.dims().end(), on_sp_axis)) continue;
      // The activation's contracted dims split as the weight's (a row-parallel input stays split
      // over its features, a column-parallel one whole); the rest as between the blocks, less the
      // sequence split.
      std::vector<PartitionSpec::Dim> dims = whole->dims();
      dims.resize(static_cast<size_t>(rank));
      const auto& pc = node.attrs.ints(side == 0 ? "lhs_contract" : "rhs_contract");
      const auto& ac = node.attrs.ints(side == 0 ? "rhs_contract" : "lhs_contract");
      for (size_t k = 0; k < pc.size() && k < ac.size(); ++k) {
        const std::vector<std::string>& split = ps[static_cast<int>(pc[k])];
        std::vector<std::string> axes;
        std::copy_if(split.begin(), split.end(), std::back_inserter(axes), is_sp);
        dims[static_cast<size_t>(ac[k])] = PartitionSpec::Dim(std::move(axes));
      }
      PartitionSpec read(std::move(dims));
      for (StepPhase phase : {StepPhase::forward, StepPhase::backward}) {
        const bool backward = phase == StepPhase::backward;
        if (backward < !p.is_forward(n) || !done.insert({act, backward}).second) continue;
        auto [lo, hi] = p.span(phase, at.microbatch);
        out.push_back({act, read, lo, hi, backward});
      }
    }
  }
}

}  // namespace

ShardingDecision decide_train_step(const StepProgram& p, const ShardingPlan& plan,
                                   const std::vector<PartitionSpec>& state_specs,
                                   const std::vector<TensorType>& batch_types, int64_t bucket_bytes) {
  const Mesh& mesh = plan.mesh;
  ShardingDecision d;
  d.mesh = mesh;
  for (const auto& pp : plan.params) d.inputs.emplace_back(mesh, pp.spec);
  for (const auto& s : state_specs) d.inputs.emplace_back(mesh, s);
  for (size_t i = 0; i < batch_types.size(); ++i)
    d.inputs.emplace_back(mesh, batch_spec(batch_types[i], mesh, plan.batch_axes, i, /*training=*/true));
  d.inputs.push_back(Sharding::replicated(mesh));
  for (int k = 0; k < 3; ++k) d.outputs.push_back(Sharding::replicated(mesh));
  for (const auto& pp : plan.params) d.outputs.push_back(Sharding(mesh, pp.spec));
  for (const auto& s : state_specs) d.outputs.push_back(Sharding(mesh, s));
  const Graph& g = *p.graph;
  const std::vector<int> grads = p.grads();
  std::vector<std::vector<int>> micro_grads;
  for (int k = 0; k < p.microbatches; ++k) micro_grads.push_back(p.micro_grads(k));
  for (size_t i = 0; i < plan.params.size(); ++i) {
    // FSDP: a param split over the batch axes is gathered once per cluster of nearby readers in
    // each pass and freed after the cluster (ZeRO-3): a layer's weights for its forward pass and
    // again for its backward pass, the tied embedding for the lookup, again for the head, and again
    // for the head's backward pass. With microbatches, each microbatch's passes gather their own.
    PartitionSpec use = use_spec(plan.params[i].spec, plan.batch_axes);
    const bool split = use != plan.params[i].spec;
    if (split) {
      const int v = g.inputs()[i];
      bool first = true;
      // Its readers per (microbatch, pass), in node order: one walk over the nodes.
      std::map<std::pair<int, bool>, std::vector<int>> readers_of;
      for (int n = 0; n < static_cast<int>(g.nodes().size()); ++n) {
        const NodeFacts& at = p.facts(n);
        if ((at.phase == StepPhase::forward || at.phase == StepPhase::backward) &&
            std::count(g.nodes()[n].inputs.begin(), g.nodes()[n].inputs.end(), v))
          readers_of[{at.microbatch, at.phase == StepPhase::backward}].push_back(n);
      }
      for (const auto& [pass, readers] : readers_of)
        for (size_t r = 0; r < readers.size();) {
          size_t e = r + 1;
          while (e < readers.size() && readers[e] - readers[e - 1] <= memory_pass::kFetchReuseNodes) ++e;
          d.constraints.push_back({v, use, readers[r], readers[e - 1] + 1, !first});
          first = false;
          r = e;
        }
    }
    // Each gradient pinned to its param's layout: one all-reduce (replicated) or reduce-scatter
    // (FSDP), shared by the norm and the update. With microbatches, a gradient that its reduction
    // splits (FSDP) is reduce-scattered per microbatch and summed in shards; the others are summed
    // whole, as partial sums, and reduced once.
    if (split && p.microbatches > 1)
      for (int k = 0; k < p.microbatches; ++k) d.constraints.push_back({micro_grads[k][i], plan.params[i].spec, -1, -1, false});
    d.constraints.push_back({grads[i], plan.params[i].spec, -1, -1, false});
  }
  // Tagged forward values with a required layout (e.g. sequence parallelism between blocks).
  std::vector<std::pair<const PathRule*, int>> matched;  // rule, the tagged value's rank
  if (!plan.activations.empty())
    for (int n = 0; n < static_cast<int>(g.nodes().size()); ++n) {
      const Node& node = g.nodes()[n];
      if (!p.is_forward(n) || node.prim != prims::tag()) continue;
      const std::string& name = node.attrs.s("name");
      for (const auto& r : plan.activations)
        if (glob_match(r.pattern, name)) {
          Sharding(mesh, r.spec)
              .validate(g.type(node.outputs[0]), "tagged value '" + name + "' (rule '" + r.pattern + "')");
          d.constraints.push_back({node.outputs[0], r.spec, -1, -1, false});
          matched.emplace_back(&r, g.type(node.outputs[0]).rank());
          break;
        }
    }
  sequence_parallel_gathers(p, plan, matched, d.constraints);
  d.buckets = gradient_buckets(p, plan, bucket_bytes);
  return d;
}

std::vector<PartitionSpec> state_specs_for(const ShardingPlan& plan, const std::vector<optim::StateSlot>& slots,
                                           const std::vector<TensorType>& param_types) {
  std::vector<PartitionSpec> specs;
  for (const auto& s : slots)
    specs.push_back(s.type.shape == param_types[s.param].shape ? plan.params[s.param].spec : PartitionSpec());
  return specs;
}

int64_t bucket_bytes_for(const ShardingPlan& plan, const ShardingOptions& sharding) {
  if (sharding.bucket_bytes >= 0) return sharding.bucket_bytes;
  double latency = 0;
  for (const auto& a : plan.batch_axes)
    latency = std::max(latency, plan.mesh.axes()[plan.mesh.axis_index(a)].link.latency_s);
  return latency >= 10e-6 ? int64_t{25} << 20 : 0;
}

// The offload pass on the partitioned local program (params and state are its first inputs, as
// in the traced step); sets the compile options that go with it, each value's layer for the
// memory report, and the donation of the state (SpmdProgram::output_donors).
void offload_local(SpmdProgram& local, const StepProgram& global, const OffloadOptions& o, CompileOptions& c) {
  StepProgram lp;
  lp.graph = std::move(local.local);
  lp.n_params = global.n_params;
  lp.n_state = global.n_state;
  lp.n_batch = global.n_batch;
  lp.paths = global.paths;
  if (!o.params.empty() || o.optimizer_state) {
    lp = offload_step(std::move(lp), o);
    c.prefetch_depth = o.prefetch_depth;
  }
  memory_pass::label_layers(lp);
  local.local = std::move(lp.graph);
  // Donation: the new params and optimizer state (outputs 3...) are written into the arrays of the
  // old ones (inputs 0...); detail::Step runs the step so, and the cost model plans it so.
  local.output_donors.assign(local.local->outputs().size(), -1);
  for (size_t k = 0; k < lp.n_params + lp.n_state && 3 + k < local.output_donors.size(); ++k)
    local.output_donors[3 + k] = static_cast<int>(k);
}

LoweredStep lower_train_step(const StepProgram& program, const ShardingPlan& plan,
                             const std::vector<PartitionSpec>& state_specs, const std::vector<TensorType>& batch_types,
                             const ShardingOptions& sharding, const CompileOptions& compile,
                             const OffloadOptions& offload) {
  LoweredStep l;
  const ShardingDecision d =
      decide_train_step(program, plan, state_specs, batch_types, bucket_bytes_for(plan, sharding));
  l.local = partition(*program.graph, d);
  l.compile = compile;
  l.compile.one_forward_pass = program.microbatches <= 1;
  offload_local(l.local, program, offload, l.compile);
  return l;
}

ShardingPlan one_device_plan(const std::vector<std::string>& paths, const std::vector<TensorType>& types) {
  ShardingPlan plan;
  plan.strategy = ShardingStrategy::DDP;
  for (size_t i = 0; i < paths.size(); ++i)
    plan.params.push_back({paths[i], types[i], PartitionSpec(), types[i].nbytes(), "one device"});
  return plan;
}

ShardedFunction::ShardedFunction(Fn fn, std::vector<TensorType> param_types, std::vector<std::string> param_paths,
                                 std::vector<TensorType> arg_types, const ForwardOptions& on) {
  // Without a mesh: one device, a mesh of one device without axes, every param replicated.
  const Mesh mesh = on.mesh ? *on.mesh : Mesh();
  const ShardingStrategy strategy = on.strategy;
  const ShardingOptions& options = on.sharding;
  if (param_paths.empty())
    for (size_t i = 0; i < param_types.size(); ++i) param_paths.push_back("param." + std::to_string(i));
  if (param_paths.size() != param_types.size())
    throw Error("[jit] " + std::to_string(param_paths.size()) + " param paths for " +
                std::to_string(param_types.size()) + " params");
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
  // The program of a plan: params gathered over the batch axes where stored split, the arguments'
  // leading dim over the batch axes.
  auto program_of = [&](const ShardingPlan& plan, bool quiet) {
    auto g = trace(
        [&](const std::vector<Tensor>& in) {
          auto [p, a] = split(in);
          return fn(gathered_params(p, plan), a);
        },
        types, names);
    std::vector<Sharding> shardings;
    for (const auto& p : plan.params) shardings.emplace_back(mesh, p.spec);
    for (size_t i = 0; i < arg_types.size(); ++i)
      shardings.emplace_back(
          mesh, quiet && arg_types[i].rank() > 0 && arg_types[i].shape[0] % axes_size(mesh, plan.batch_axes) != 0
                    ? PartitionSpec()
                    : batch_spec(arg_types[i], mesh, plan.batch_axes, i, /*training=*/false));
    SpmdProgram prog = partition(*g, mesh, shardings);
    return std::make_pair(std::move(g), std::move(prog));
  };
  if (!on.mesh) {
    plan_ = one_device_plan(param_paths, param_types);
  } else if (strategy == ShardingStrategy::AUTO) {
    plan_ = solve_auto_once(options, mesh, param_paths, param_types, [&] {
      Cluster cluster = load_cluster(options.auto_cluster);
      autoshard::Problem pr;
      pr.forward = plain.get();
      pr.mesh = cluster.apply(mesh);
      pr.full.paths = param_paths;
      pr.full.types = param_types;
      pr.full.state_copies.assign(np, 0);
      pr.full.grads = 0;
      pr.full.cost = [&](const ShardingPlan& plan) {
        ShardingPlan p = plan;
        p.mesh = mesh;
        return cost_program(program_of(p, true).second, cluster);
      };
      pr.memory_limit = options.auto_memory_limit_bytes > 0 ? options.auto_memory_limit_bytes
                                                            : cluster.device_on(pr.mesh).memory_bytes;
      pr.options = options;
      AutoPlan a = autoshard::solve(pr);
      a.plan.mesh = mesh;
      return a;
    });
  } else {
    plan_ = plan_sharding(*plain, param_paths, mesh, strategy, options);
  }
  auto [g, prog] = program_of(plan_, false);
  graph_ = std::move(g);
  // Donation: each donated argument takes the first output of its type and sharding not taken.
  names_ = names;
  CompileOptions copt = on.compile;
  const size_t nin = types.size(), nout = prog.local->outputs().size();
  donor_of_out_.assign(nout, -1);
  for (int i : on.donate) {
    if (i < 0 || static_cast<size_t>(i) >= nin || std::count(donate_.begin(), donate_.end(), i))
      throw UserError("[jit] donate: " + std::to_string(i) + " is not an argument position (0 to " +
                      std::to_string(nin - 1) + ", params first), or is given twice");
    donate_.push_back(i);
    const int in = prog.local->inputs()[i];
    for (size_t o = 0; o < nout; ++o)
      if (donor_of_out_[o] < 0 && prog.local->type(prog.local->outputs()[o]) == prog.local->type(in) &&
          prog.out_shardings[o] == prog.in_shardings[i]) {
        donor_of_out_[o] = i;
        break;
      }
  }
  if (!donate_.empty()) copt.output_donors = donor_of_out_;
  exe_ = ShardedExecutable::compile(std::move(prog), copt, options.device_parallelism, options.communicator);
}

ShardedFunction::~ShardedFunction() = default;

std::vector<Array> ShardedFunction::operator()(const std::vector<Array>& params, const std::vector<Array>& args) {
  if (!donate_.empty())
    throw UserError(
        "[jit] this function donates arguments (ForwardOptions::donate): call it with non-const "
        "std::vector<px::Array> lvalues, so that the donated arrays can be released");
  std::vector<Array> in = params;
  in.insert(in.end(), args.begin(), args.end());
  return run(in, false);
}

std::vector<Array> ShardedFunction::operator()(std::vector<Array>& params, std::vector<Array>& args) {
  std::vector<Array> in = params;
  in.insert(in.end(), args.begin(), args.end());
  for (int i : donate_)
    if (static_cast<size_t>(i) < in.size() && !in[i].defined())
      throw UserError("[jit] argument " + std::to_string(i) + " ('" + names_[i] +
                      "') has no data: it was donated to an earlier call (ForwardOptions::donate), which released "
                      "it; pass the array that call returned instead");
  for (int i : donate_)
    if (static_cast<size_t>(i) < in.size() && in[i].read_only())
      throw UserError("[jit] argument " + std::to_string(i) + " ('" + names_[i] +
                      "') is donated (ForwardOptions::donate) but is read-only memory adopted from another library "
                      "(Array::adopt): the program would write its result into it; pass a writable copy "
                      "(Array::clone)");
  std::vector<Array> out = run(in, !donate_.empty());
  // Released: the donated buffers now hold outputs.
  for (int i : donate_) {
    const size_t k = static_cast<size_t>(i);
    if (k < params.size())
      params[k] = Array();
    else if (k - params.size() < args.size())
      args[k - params.size()] = Array();
  }
  return out;
}

std::vector<Array> ShardedFunction::run(const std::vector<Array>& in, bool donating) {
  if (plan_.mesh.size() > 1) return exe_->run_full(in);
  // One device: each array is its own only shard, passed and returned without a copy.
  std::vector<ShardedArray> sharded;
  for (size_t i = 0; i < in.size(); ++i) {
    const Sharding& s = exe_->in_sharding(static_cast<int>(i));
    if (in[i].type() != exe_->program().local->type(exe_->program().local->inputs()[i]))
      return exe_->run_full(in);  // run_full names the mismatch
    sharded.emplace_back(in[i].type(), s, std::vector<Array>{in[i]});
  }
  // A donated argument's array takes its output (written in place); without donation, fresh arrays.
  std::vector<ShardedArray> outs(donor_of_out_.size());
  for (size_t o = 0; donating && o < outs.size(); ++o)
    if (donor_of_out_[o] >= 0) outs[o] = sharded[donor_of_out_[o]];
  exe_->run_into(sharded, outs);
  std::vector<Array> out;
  for (ShardedArray& r : outs) out.push_back(r.shards()[0]);
  return out;
}

std::unique_ptr<ShardedFunction> jit(ShardedFunction::Fn fn, ShardingStrategy strategy,
                                     const std::vector<TensorType>& param_types,
                                     const std::vector<std::string>& param_paths,
                                     const std::vector<TensorType>& arg_types, const Mesh& mesh,
                                     const ShardingOptions& options) {
  return std::make_unique<ShardedFunction>(std::move(fn), param_types, param_paths, arg_types,
                                           ForwardOptions{.mesh = mesh, .strategy = strategy, .sharding = options});
}

}  // namespace px
