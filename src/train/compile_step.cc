// The pass pipeline of a training step, listed once and in order (build_step). Every step runs
// it: one device (a mesh of one device, every param replicated), any mesh, gradient accumulation
// (M microbatches traced inside the step) and pipelines (S stages: the step of one microbatch,
// cut into stage programs that the schedule runs M times):
//
//   shape              stages, schedule, what is traced      step_shape (below)
//   trace + autodiff   trace_train_step                      src/train/trace_step.cc
//   sharding decision  one device, recipe or AUTO            plan_step (below), src/sharding/
//   remat              remat_step / remat_automatic          src/memory/remat.cc
//   partition          annotate, propagate, partition        src/sharding/partitioner.cc
//   offload            offload_local                         src/memory/offload.cc
//     (S stages: the stage cut, then partition and offload per stage program: stage_programs.cc)
//   memory check       plan_program, the settings that would fit   (below)
//   compile            autocast, cse + dce, schedule and fusion, collective lowering, buffer plan
//                                                       src/runtime/executable.cc
//
// Remat `auto` plans each candidate through the same passes (nothing compiled), AUTO's costing
// calls lower_train_step (partition, offload), and AUTO's pipelined candidates are this pipeline
// with compile = false. Each pass writes its result under PX_DUMP (core/dump.h) as
// train_step.NN.<pass>.txt; the candidates planned on the way only with PX_DUMP_CANDIDATES=1.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <optional>

#include "core/dump.h"
#include "memory/rewrite.h"
#include "parallax/plan.h"
#include "runtime/program.h"
#include "sharding/groups.h"
#include "sharding/recipes/step.h"
#include "train/pipeline_step.h"
#include "train/steps.h"

namespace px::detail {
namespace {

// The program after the sharding decision (lower_train_step: decide, partition, offload), with the
// compile options of this step: its platform, the state donated (planned once).
LoweredStep lower(const StepProgram& p, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                  const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                  const OffloadOptions& offload) {
  LoweredStep l = lower_train_step(p, plan, state_specs, batch_types, options.sharding, options.compile, offload);
  l.compile.platform = plan.mesh.platform();
  l.compile.output_donors = l.local.output_donors;
  dump_pass("offload", [&] { return l.local.local->to_string(); });
  return l;
}

// The planned memory of one device (nothing allocated), without a limit.
MemoryReport planned(const StepProgram& p, const ShardingPlan& plan, const std::vector<PartitionSpec>& state_specs,
                     const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                     const OffloadOptions& offload) {
  LoweredStep l = lower(p, plan, state_specs, batch_types, options, offload);
  l.compile.memory_limit_bytes = l.compile.host_memory_limit_bytes = 0;
  return plan_program(*l.local.local, l.compile, collective_groups(plan.mesh)).report;
}

// The per-device memory limit: the compile option, else the smallest capacity of the mesh's devices.
int64_t memory_limit(const TrainStepOptions& options, const Mesh& mesh) {
  if (options.compile.memory_limit_bytes > 0) return options.compile.memory_limit_bytes;
  int64_t limit = 0;
  for (int id : mesh.device_ids()) {
    const int64_t cap = memory_capacity({id, MemoryKind::device, mesh.platform()});
    if (cap > 0 && (limit == 0 || cap < limit)) limit = cap;
  }
  return limit;
}

// Over the limit: the error says what is at the peak and which settings would fit, each with its
// planned peak.
[[noreturn]] void over_limit(const MemoryReport& report, int64_t limit, const TrainStepOptions& options,
                             const std::function<StepProgram(int microbatches)>& traced,
                             const std::function<int64_t(const StepProgram&, const OffloadOptions&)>& peak_with,
                             const StepProgram& program, int devices) {
  DumpCandidates candidates;
  std::string alternatives;
  for (RematPolicy p : {RematPolicy::dots_saveable, RematPolicy::full, RematPolicy::nothing_saveable}) {
    if (p == options.remat.policy) continue;
    const int64_t q = peak_with(remat_step(traced(options.microbatches), {p, {}}), options.offload);
    alternatives += fmt::format("\n  remat {}: {} bytes{}", remat_policy_name(p), q, q <= limit ? " (fits)" : "");
  }
  OffloadOptions all = options.offload;
  all.params = {"*"};
  all.optimizer_state = true;
  const int64_t q = peak_with(program, all);
  alternatives += fmt::format("\n  offload params and optimizer state: {} bytes{}", q, q <= limit ? " (fits)" : "");
  const int64_t both = peak_with(remat_step(traced(options.microbatches), {RematPolicy::full, {}}), all);
  alternatives += fmt::format("\n  remat full and offload both: {} bytes{}", both, both <= limit ? " (fits)" : "");
  // More microbatches, where they divide each device's rows: one microbatch's activations at a time.
  for (int m : {2 * options.microbatches, 4 * options.microbatches}) {
    StepProgram p;
    try {
      p = remat_step(traced(m), options.remat);
    } catch (const UserError&) {
      continue;
    }
    const int64_t q = peak_with(p, options.offload);
    alternatives += fmt::format("\n  microbatches {}: {} bytes{}", m, q, q <= limit ? " (fits)" : "");
  }
  // FSDP over n times the devices splits params, gradients and optimizer state n ways more (an
  // estimate from the split above: activations stay as they are, collective buffers are left out).
  auto at_peak = [&](MemoryCategory c) { return report.by_category[static_cast<int>(c)]; };
  const int64_t state =
      at_peak(MemoryCategory::params) + at_peak(MemoryCategory::gradients) + at_peak(MemoryCategory::optimizer_state);
  for (int n : {2, 4, 8}) {
    const int64_t est = report.peak_bytes - state + state / n;
    alternatives +=
        fmt::format("\n  FSDP over {} devices: about {} bytes{}", n * devices, est, est <= limit ? " (fits)" : "");
  }
  throw UserError(fmt::format(
      "[TrainStep] the step needs {} bytes per device with remat {}{}, over the memory limit of {} bytes. "
      "At the peak:\n{}Planned peaks with other settings:{}\nSet TrainStepOptions::remat (RematPolicy::automatic "
      "picks the least recompute that fits) or TrainStepOptions::offload, raise TrainStepOptions::microbatches, "
      "shrink the batch, or shard the step over "
      "more devices (TrainStepOptions::mesh with FSDP)",
      report.peak_bytes, remat_policy_name(options.remat.policy),
      options.offload.params.empty() && !options.offload.optimizer_state ? "" : " and the offload set", limit,
      report.to_string(), alternatives));
}

// Each device's microbatch is a slice of its own rows: microbatches must divide them.
void check_rows_per_device(const ShardingPlan& plan, const std::vector<TensorType>& batch_types, int microbatches) {
  int64_t devices = 1;
  std::string axes;
  for (const std::string& a : plan.batch_axes) {
    devices *= plan.mesh.axis_size(a);
    axes += (axes.empty() ? "" : ", ") + a;
  }
  if (microbatches <= 1 || devices <= 1) return;
  for (size_t i = 0; i < batch_types.size(); ++i) {
    const TensorType& t = batch_types[i];
    if (t.rank() == 0 || t.shape[0] % devices != 0) continue;  // the batch split says what is wrong
    const int64_t rows = t.shape[0] / devices;
    if (rows % microbatches != 0)
      throw UserError(fmt::format(
          "[TrainStep] microbatches = {} does not divide the rows of batch array {} ({}) that each device holds: "
          "it is split over the batch axes ({}) of {} devices, {} rows each, and each device's microbatch is a "
          "slice of its own rows; use a batch size that is a multiple of {} or a microbatch count that divides {}",
          microbatches, i, type_str(t), axes, devices, rows, devices * microbatches, rows));
  }
}

// What Step holds: the staged programs and the runner that runs them, each state array on its
// stage's devices (one stage: the mesh's).
CompiledStep compiled(BuiltStep b, const TrainStepOptions& options) {
  CompiledStep c;
  c.plan = std::move(b.plan);
  c.state_specs = std::move(b.state_specs);
  c.n_params = b.staged.n_params;
  c.n_state = b.staged.n_state;
  c.index_uses = index_uses(*b.graph);
  c.graph = std::move(b.graph);
  c.comm = c.plan.mesh.num_processes() > 1 ? options.sharding.communicator : nullptr;
  const bool whole_group = b.staged.process_of_group.empty();  // one stage over every process
  c.runner = std::make_unique<PipelineRunner>(std::move(b.staged), whole_group ? nullptr : c.comm);
  c.in_shardings = c.runner->input_shardings();
  c.process = c.runner->process();
  return c;
}

// A pipelined step over the memory limit on some device group: what is planned where, and what helps.
void check_pipeline_memory(const PipelineReport& r, const TrainStepOptions& options, const Mesh& mesh) {
  const int64_t limit = memory_limit(options, mesh);
  for (int d = 0; d < r.schedule.devices; ++d)
    if (limit > 0 && r.planned_peak(d) > limit)
      throw UserError(fmt::format(
          "[TrainStep] the pipelined step needs {} bytes on device group {}, over the memory limit of {} bytes:\n{}"
          "Raise the microbatch count (smaller microbatches), use 1F1B rather than GPipe, set a remat policy, or "
          "use more stages",
          r.planned_peak(d), d, limit, r.to_string()));
}

// How a step is cut: S stages run by a schedule (1 on a mesh without a `stage` axis) and M
// microbatches. The sharding plan is made for one stage's devices (the mesh without its `stage`
// axis), and what is traced is the whole batch with its microbatches inside (one stage), or the
// step of one microbatch (S stages: the schedule runs it M times).
struct StepShape {
  int stages = 1;
  pipeline::Schedule schedule;
  Mesh mesh, group;
  bool sharded = false;  // planned by a recipe or AUTO; else one device's plan, every param whole
  std::vector<TensorType> traced_types;
  int traced_microbatches = 1;
};

StepShape step_shape(const TrainStepOptions& options, const std::vector<TensorType>& batch_types) {
  StepShape s;
  s.mesh = s.group = options.mesh ? *options.mesh : Mesh();
  s.sharded = options.mesh.has_value();
  s.traced_types = batch_types;
  s.traced_microbatches = options.microbatches;
  if (!options.mesh || !pipeline::has_stage_axis(*options.mesh)) return s;
  if (s.mesh.num_processes() > 1 && !options.sharding.communicator)
    throw UserError("[pipeline] the mesh " + s.mesh.to_string() +
                    " spans several processes: give this process's communicator (ShardingOptions::communicator, "
                    "e.g. px::process_world().communicator)");
  check_microbatches(options.microbatches, batch_types, "TrainStep");
  const int M = options.microbatches;
  s.stages = static_cast<int>(s.mesh.axis_size("stage"));
  s.schedule = pipeline::make_schedule(options.pipeline.schedule, s.stages, M, options.pipeline.virtual_stages);
  std::vector<MeshAxis> others;
  for (const MeshAxis& a : s.mesh.axes())
    if (a.name != "stage") others.push_back(a);
  s.group = Mesh(others, {}, s.mesh.platform());
  s.sharded = s.group.size() > 1;
  for (TensorType& t : s.traced_types)
    if (t.rank() > 0) t.shape[0] /= M;
  s.traced_microbatches = 1;
  return s;
}

// The stage programs of a pipelined step (compile = false: planned only).
StagedStep cut(StepProgram p, const DecidedStep& d, const StepShape& s, const TrainStepOptions& options,
               const Cluster* cluster, bool compile) {
  return stage_programs(std::move(p), s.schedule, options.pipeline, s.mesh, d.plan, d.state_specs, options.compile,
                        options.offload, cluster, compile);
}

// The planned peak of one device with step program `p` under d's plan (the busiest device group's
// of a pipeline, with the microbatches its schedule holds): nothing compiled.
int64_t planned_peak(const StepProgram& p, const DecidedStep& d, const StepShape& s,
                     const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                     const Cluster* cluster) {
  DumpCandidates quiet;
  if (s.stages == 1) return planned(p, d.plan, d.state_specs, batch_types, options, options.offload).peak_bytes;
  const PipelineReport rep = pipeline_report(cut(p.clone(), d, s, options, cluster, false));
  int64_t peak = 0;
  for (int g = 0; g < rep.schedule.devices; ++g) peak = std::max(peak, rep.planned_peak(g));
  return peak;
}

// The sharding plan: one device's, a recipe's, or AUTO's search for the step (under remat `auto`,
// the step that saves the least: a plan that fits at all fits with it). Over several processes
// AUTO's first process solves and sends its plan.
ShardingPlan plan_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                       const StepProgram& traced, const StepShape& s, const TrainStepOptions& options) {
  if (!s.sharded) {
    ShardingPlan plan = one_device_plan(store.paths(), store.types());
    if (s.stages > 1) plan.mesh = s.group;
    return plan;
  }
  DumpCandidates quiet;  // the forward program and AUTO's candidates are not passes of this step
  auto fwd = nn::trace_with_params(
      store, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss_fn(b)}; }, s.traced_types);
  if (options.strategy != ShardingStrategy::AUTO)
    return plan_sharding(*fwd, store.paths(), s.group, options.strategy, options.sharding);
  const bool remat_auto = options.remat.policy == RematPolicy::automatic;
  const StepProgram planned_on =
      remat_step(traced.clone(), remat_auto ? RematOptions{RematPolicy::nothing_saveable, {}} : options.remat);
  const std::vector<TensorType> types = store.types();
  ShardingPlan plan = solve_auto_once(options.sharding, s.mesh, store.paths(), types, [&] {
    return solve_train_step(*fwd, planned_on, opt.state_slots(types), types, s.traced_types, s.group,
                            options.sharding, options.compile, options.offload);
  });
  if (s.stages > 1) plan.mesh = s.group;
  return plan;
}

// Passes 1-3, for every kind of step: trace and differentiate, the sharding decision, remat. A
// recipe's plan needs only the forward program, so remat `auto` measures each candidate under it.
DecidedStep decide(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                   const std::vector<TensorType>& batch_types, const TrainStepOptions& options, const StepShape& s,
                   const Cluster* cluster = nullptr) {
  DecidedStep d;
  d.program = trace_train_step(store, opt, loss_fn, s.traced_types, options.clip_norm, "TrainStep",
                               options.skip_nonfinite, s.traced_microbatches);
  d.plan = plan_step(store, opt, loss_fn, d.program, s, options);
  if (s.stages > 1) {  // each device's rows split over the batch axes inside a stage
    int64_t shards = 1;
    for (const std::string& a : d.plan.batch_axes) shards *= s.group.axis_size(a);
    for (size_t i = 0; i < batch_types.size(); ++i)
      if (batch_types[i].rank() > 0 && batch_types[i].shape[0] % shards != 0)
        throw UserError(fmt::format(
            "[pipeline] batch array {} ({}) does not split over the {} devices of the batch axes inside a stage: use "
            "a batch size that is a multiple of {}",
            i, type_str(batch_types[i]), shards, shards * options.microbatches));
  }
  check_rows_per_device(d.plan, batch_types, options.microbatches);
  d.state_specs = state_specs_for(d.plan, opt.state_slots(store.types()), store.types());
  if (options.remat.policy == RematPolicy::automatic) {
    auto peak_of = [&](const StepProgram& p) { return planned_peak(p, d, s, batch_types, options, cluster); };
    const int64_t budget =
        options.remat.budget_bytes > 0 ? options.remat.budget_bytes : memory_limit(options, s.mesh);
    d.program = remat_automatic(std::move(d.program), budget, peak_of);
  } else {
    d.program = remat_step(std::move(d.program), options.remat);
  }
  dump_pass("remat", [&] { return d.program.graph->to_string(); });
  return d;
}

// Passes 4-6 of a step of one stage: partition and offload, the memory check (over the limit, say
// what is at the peak and what would fit), then compile.
StagedStep lower_one_stage(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                           const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                           const DecidedStep& d) {
  const Mesh& mesh = d.plan.mesh;
  LoweredStep l = lower(d.program, d.plan, d.state_specs, batch_types, options, options.offload);
  const int64_t limit = memory_limit(options, mesh);
  if (limit > 0 && options.remat.policy != RematPolicy::automatic) {
    MemoryReport report;
    {
      DumpCandidates quiet;
      CompileOptions unlimited = l.compile;
      unlimited.memory_limit_bytes = unlimited.host_memory_limit_bytes = 0;
      report = plan_program(*l.local.local, unlimited, collective_groups(mesh)).report;
    }
    if (report.peak_bytes > limit) {
      auto traced = [&](int microbatches) {  // throws px::UserError where they do not divide the rows
        check_rows_per_device(d.plan, batch_types, microbatches);
        return trace_train_step(store, opt, loss_fn, batch_types, options.clip_norm, "TrainStep",
                                options.skip_nonfinite, microbatches);
      };
      auto peak_with = [&](const StepProgram& p, const OffloadOptions& o) {
        return planned(p, d.plan, d.state_specs, batch_types, options, o).peak_bytes;
      };
      over_limit(report, limit, options, traced, peak_with, d.program, mesh.size());
    }
  }
  // The program is the whole step, the one stage of a pipeline of one stage.
  return one_stage(d.program.graph->clone(),
                   ShardedExecutable::compile(std::move(l.local), l.compile, options.sharding.device_parallelism,
                                              options.sharding.communicator),
                   d.program.n_params, d.program.n_state);
}

// The memory a device of `mesh` may use for a pipelined candidate: AUTO's limit, else the cluster's.
int64_t capacity_of(const TrainStepOptions& base, const Cluster& cluster, const Mesh& mesh) {
  return base.sharding.auto_memory_limit_bytes > 0 ? base.sharding.auto_memory_limit_bytes
                                                   : cluster.device_on(mesh).memory_bytes;
}

// The options that train pipelined candidate c.
TrainStepOptions candidate_options(TrainStepOptions o, const PipelineCandidate& c) {
  o.mesh = c.mesh;
  o.strategy = c.strategy;
  o.microbatches = c.microbatches;
  o.pipeline = c.pipeline;
  return o;
}

// Plans candidate c on the cluster (nothing compiled): its report, and whether every device group
// fits. False when it does not apply (a split, microbatch count or plan that does not fit the model).
bool plan_candidate(PipelineCandidate& c, nn::ParamStore& store, const optim::Optimizer& opt,
                    const TrainStep::LossFn& loss_fn, const std::vector<TensorType>& batch_types,
                    const TrainStepOptions& base, const Cluster& cluster) {
  try {
    c.report = pipeline_report(
        build_step(store, opt, loss_fn, batch_types, candidate_options(base, c), &cluster, false).staged);
  } catch (const UserError&) {
    return false;
  }
  const int64_t capacity = capacity_of(base, cluster, c.mesh);
  c.fits = true;
  for (int d = 0; d < c.report.schedule.devices; ++d) c.fits = c.fits && c.report.planned_peak(d) <= capacity;
  return true;
}

// AUTO with ShardingOptions::auto_pipeline: the fastest pipelined plan of the mesh's devices that
// fits, when it is predicted faster than `flat_s` (the best plan on the mesh as given).
std::optional<TrainStepOptions> faster_pipeline(nn::ParamStore& store, const optim::Optimizer& opt,
                                                const TrainStep::LossFn& loss_fn,
                                                const std::vector<TensorType>& batch_types,
                                                const TrainStepOptions& options, double flat_s, std::string& why) {
  const Cluster cluster = load_cluster(options.sharding.auto_cluster);
  std::vector<PipelineCandidate> candidates = pipeline_candidates(
      store, opt, loss_fn, batch_types, options, cluster, [](int64_t) { return true; },
      std::numeric_limits<double>::infinity());
  if (candidates.empty() || !candidates[0].fits) return {};
  // The recipes ranked the stage counts, schedules and microbatch counts; AUTO's own search then
  // plans inside the stages of the fastest (one solve), kept when predicted faster still.
  if (candidates[0].mesh.size() > candidates[0].report.schedule.devices) {
    PipelineCandidate c = candidates[0];
    c.strategy = ShardingStrategy::AUTO;
    DumpCandidates quiet;
    if (plan_candidate(c, store, opt, loss_fn, batch_types, options, cluster) && c.fits &&
        c.report.predicted_step_s < candidates[0].report.predicted_step_s)
      candidates.insert(candidates.begin(), std::move(c));
  }
  if (!(candidates[0].report.predicted_step_s < flat_s)) return {};
  const PipelineCandidate& c = candidates[0];
  why = fmt::format(
      "AUTO: pipelined on {}, {} inside the stages, {}, {} microbatches: predicted {:.4g} s per step on {}, against "
      "{} for the best plan on the mesh as given\n",
      c.mesh.to_string(), strategy_name(c.strategy), pipeline::kind_name(c.pipeline.schedule), c.microbatches,
      c.report.predicted_step_s, cluster.name,
      std::isfinite(flat_s) ? fmt::format("{:.4g} s", flat_s) : std::string("none that fits"));
  why += fmt::format("  predicted bubble {:.3f} ({:.3f} in theory); {} candidates planned\n", c.report.predicted_bubble,
                     c.report.bubble_theory(), candidates.size());
  for (size_t st = 0; st < c.report.stage_layers.size(); ++st)
    why += fmt::format("  stage {} (device group {}): {}\n", st, c.report.schedule.device_of(static_cast<int>(st)),
                       fmt::join(c.report.stage_layers[st], ", "));
  return candidate_options(options, c);
}

// Passes 4-6 of a decided step: its stage programs (one: the whole step), compiled or planned.
BuiltStep built(DecidedStep d, const StepShape& s, nn::ParamStore& store, const optim::Optimizer& opt,
                const TrainStep::LossFn& loss_fn, const std::vector<TensorType>& batch_types,
                const TrainStepOptions& options, const Cluster* cluster, bool compile) {
  BuiltStep r;
  r.graph = d.program.graph->clone();
  if (s.stages == 1) {
    if (!compile)
      throw UserError("[plan_pipeline] the mesh " + s.mesh.to_string() +
                      " has no `stage` axis: a pipeline's plan needs one (e.g. Mesh({{\"stage\", 2, {}}})); a mesh "
                      "without one is planned by px::plan_auto or px::cost_recipes");
    r.staged = lower_one_stage(store, opt, loss_fn, batch_types, options, d);
  } else {
    r.staged = cut(std::move(d.program), d, s, options, cluster, compile);
    if (compile) check_pipeline_memory(pipeline_report(r.staged), options, s.mesh);
    d.plan.mesh = s.mesh;
    for (ParamPlacement& pp : d.plan.params)
      for (size_t st = 0; st < r.staged.stage_layers.size(); ++st)
        for (const std::string& l : r.staged.stage_layers[st])
          if (l == memory_pass::layer_of(pp.path))
            pp.reason = fmt::format("stage {} (device group {}), {}", st, s.schedule.device_of(static_cast<int>(st)),
                                    pp.reason);
  }
  r.plan = std::move(d.plan);
  r.state_specs = std::move(d.state_specs);
  return r;
}

}  // namespace

// The pass pipeline of every step (the file's header): flat, accumulated or pipelined, each pass
// once. A pipelined step's passes 4-6 run per stage program (stage_programs.cc); compile = false
// plans them without compiling (AUTO's pipelined candidates, plan_pipeline).
BuiltStep build_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                     const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                     const Cluster* cluster, bool compile) {
  const StepShape s = step_shape(options, batch_types);
  return built(decide(store, opt, loss_fn, batch_types, options, s, cluster), s, store, opt, loss_fn, batch_types,
               options, cluster, compile);
}


std::vector<PipelineCandidate> pipeline_candidates(nn::ParamStore& store, const optim::Optimizer& opt,
                                                   const TrainStep::LossFn& loss_fn,
                                                   const std::vector<TensorType>& batch_types,
                                                   const TrainStepOptions& base, const Cluster& cluster,
                                                   const std::function<bool(int64_t)>& stages_ok, double time_limit_s) {
  DumpCandidates quiet;
  const auto t0 = std::chrono::steady_clock::now();
  const Mesh& mesh = *base.mesh;
  const int64_t n = mesh.size();
  const int64_t rows = !batch_types.empty() && batch_types[0].rank() > 0 ? batch_types[0].shape[0] : 0;
  // What the params, their gradient sums and the optimizer state take: a device holds at least its
  // share of them (1 / S of the layers, split over the devices its recipe splits them over), so
  // a candidate over the memory on that alone is not planned.
  int64_t state_bytes = 0;
  const std::vector<TensorType> types = store.types();
  for (const TensorType& t : types) state_bytes += 2 * t.nbytes();
  for (const optim::StateSlot& slot : opt.state_slots(types)) state_bytes += slot.type.nbytes();
  std::vector<PipelineCandidate> out;
  for (int64_t S = 2; S <= n; ++S) {
    if (n % S != 0 || !stages_ok(S)) continue;
    const int64_t rest = n / S;
    // Inside a stage: its devices over `data` (DDP, FSDP), or tensor parallel over a node's
    // devices (`model`, TP or FSDP_TP) and the rest over `data`.
    std::vector<int64_t> tensor_parallel = {1};
    if (cluster.devices_per_node > 1 && rest % cluster.devices_per_node == 0)
      tensor_parallel.push_back(cluster.devices_per_node);
    for (int64_t t : tensor_parallel) {
      std::vector<MeshAxis> axes = {{"stage", S, {}}};
      if (rest / t > 1) axes.push_back({"data", rest / t, {}});
      if (t > 1) axes.push_back({"model", t, {}});
      const Mesh m = cluster.apply(Mesh(axes, mesh.device_ids(), mesh.platform()));
      const int64_t capacity = capacity_of(base, cluster, m);
      const int64_t dp = rest / t;  // devices the batch splits over
      for (ShardingStrategy strategy : t > 1 ? std::vector{ShardingStrategy::TP, ShardingStrategy::FSDP_TP}
                                             : std::vector{ShardingStrategy::DDP, ShardingStrategy::FSDP}) {
        const bool fsdp = strategy == ShardingStrategy::FSDP || strategy == ShardingStrategy::FSDP_TP;
        if ((dp == 1 && fsdp) || state_bytes / (S * (fsdp ? rest : t)) > capacity) continue;
        for (pipeline::Kind kind : {pipeline::Kind::one_f_one_b, pipeline::Kind::zero_bubble})
          for (int64_t M : {2 * S, 4 * S}) {
            if (rows % dp != 0 || (rows / dp) % M != 0) continue;
            if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > time_limit_s) break;
            PipelineCandidate c;
            c.mesh = m;
            c.strategy = strategy;
            c.pipeline.schedule = kind;
            c.pipeline.balance = true;
            c.microbatches = static_cast<int>(M);
            if (plan_candidate(c, store, opt, loss_fn, batch_types, base, cluster)) out.push_back(std::move(c));
          }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const PipelineCandidate& a, const PipelineCandidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.report.predicted_step_s < b.report.predicted_step_s;
  });
  return out;
}

CompiledStep::CompiledStep() = default;
CompiledStep::CompiledStep(CompiledStep&&) noexcept = default;
CompiledStep& CompiledStep::operator=(CompiledStep&&) noexcept = default;
CompiledStep::~CompiledStep() = default;

DecidedStep decide_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                        const std::vector<TensorType>& batch_types, const TrainStepOptions& options) {
  if (options.mesh && pipeline::has_stage_axis(*options.mesh))
    throw UserError(
        "[plan] a mesh with a `stage` axis is planned when its step is built (TrainStep: pipeline_report(); "
        "pax: train with PX_PROFILE=1 writes it to profile.txt); the plan of shardings covers meshes "
        "without one");
  return decide(store, opt, loss_fn, batch_types, options, step_shape(options, batch_types));
}

CompiledStep compile_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                          const std::vector<TensorType>& batch_types, const TrainStepOptions& options) {
  DumpProgram dump("train_step");
  // AUTO may pipeline the mesh's devices instead (auto_pipeline) when that is predicted faster
  // than its best plan on the mesh as given, unless the user's rules name the mesh's axes.
  const bool try_pipeline = options.mesh && !pipeline::has_stage_axis(*options.mesh) &&
                            options.strategy == ShardingStrategy::AUTO && options.sharding.auto_pipeline &&
                            options.mesh->num_processes() == 1 && options.sharding.rules.empty() &&
                            options.sharding.activation_rules.empty();
  if (!try_pipeline) return compiled(build_step(store, opt, loss_fn, batch_types, options), options);
  const StepShape s = step_shape(options, batch_types);
  std::optional<DecidedStep> d;
  std::optional<UserError> flat_error;
  try {
    d = decide(store, opt, loss_fn, batch_types, options, s);
  } catch (const UserError& e) {
    flat_error = e;  // nothing fits as given: a pipeline may
  }
  std::string why;
  const double flat_s = d ? d->plan.predicted_step_s : std::numeric_limits<double>::infinity();
  if (std::optional<TrainStepOptions> piped = faster_pipeline(store, opt, loss_fn, batch_types, options, flat_s, why)) {
    CompiledStep c = compiled(build_step(store, opt, loss_fn, batch_types, *piped), *piped);
    c.plan.explanation = why + (d ? d->plan.explanation : "");
    return c;
  }
  if (flat_error) throw *flat_error;
  return compiled(built(std::move(*d), s, store, opt, loss_fn, batch_types, options, nullptr, true), options);
}

}  // namespace px::detail
