// The pass pipeline of a training step, listed once and in order. Every step runs it, on one
// device (a mesh of one device, every param replicated) as on any mesh:
//
//   trace + autodiff   trace_train_step                 src/train/trace_step.cc
//   remat              remat_step / remat_automatic     src/memory/remat.cc
//   sharding decision  one device, recipe or AUTO       src/sharding/recipes/, src/sharding/auto/
//   partition          annotate, propagate, partition   src/sharding/partitioner.cc
//   offload            offload_local                    src/memory/offload.cc
//   memory check       plan_program, the settings that would fit   (below)
//   compile            autocast, cse + dce, schedule and fusion, collective lowering, buffer plan
//                                                       src/runtime/executable.cc
//
// Each pass writes its result under PX_DUMP (core/dump.h) as train_step.NN.<pass>.txt. The
// candidates that remat `auto` or AUTO plan on the way are dumped only with PX_DUMP_CANDIDATES=1.
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
CompiledStep compiled(PipelinedStep b, const TrainStepOptions& options) {
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

// The pipeline pass, compiled and checked against the memory limit.
CompiledStep compile_pipelined(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                               const std::vector<TensorType>& batch_types, const TrainStepOptions& options) {
  CompiledStep c = compiled(build_pipelined(store, opt, loss_fn, batch_types, options), options);
  check_pipeline_memory(c.runner->report(), options, c.plan.mesh);
  return c;
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
        build_pipelined(store, opt, loss_fn, batch_types, candidate_options(base, c), &cluster, false).staged);
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

}  // namespace

// The pipeline pass (see pipeline_step.h): the step of one microbatch, traced and remat'd as any
// step, cut into stage programs that each go through the runtime's passes (stage_programs.cc).
PipelinedStep build_pipelined(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                              const std::vector<TensorType>& batch_types, const TrainStepOptions& options,
                              const Cluster* cluster, bool compile) {
  const Mesh& mesh = *options.mesh;
  if (mesh.num_processes() > 1 && !options.sharding.communicator)
    throw UserError("[pipeline] the mesh " + mesh.to_string() +
                    " spans several processes: give this process's communicator (ShardingOptions::communicator, "
                    "e.g. px::process_world().communicator)");
  check_microbatches(options.microbatches, batch_types, "TrainStep");
  const int M = options.microbatches;
  const pipeline::Schedule schedule = pipeline::make_schedule(
      options.pipeline.schedule, static_cast<int>(mesh.axis_size("stage")), M, options.pipeline.virtual_stages);
  std::vector<TensorType> micro_types = batch_types;
  for (TensorType& t : micro_types)
    if (t.rank() > 0) t.shape[0] /= M;

  // The recipe's plan for one stage's devices (the mesh without its `stage` axis).
  std::vector<MeshAxis> others;
  for (const MeshAxis& a : mesh.axes())
    if (a.name != "stage") others.push_back(a);
  const Mesh group(others, {}, mesh.platform());
  ShardingPlan plan = one_device_plan(store.paths(), store.types());  // a stage on one device: every param whole
  plan.mesh = group;
  if (group.size() > 1) {
    DumpCandidates quiet;  // the forward program and AUTO's candidates are not passes of this step
    auto fwd = nn::trace_with_params(
        store, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss_fn(b)}; }, micro_types);
    if (options.strategy != ShardingStrategy::AUTO) {
      plan = plan_sharding(*fwd, store.paths(), group, options.strategy, options.sharding);
    } else {
      // AUTO inside the stages: its search for the step of one microbatch on a stage's devices
      // (the whole model costed there: each stage's params get the same layouts). Over several
      // processes the first solves and sends its plan.
      const StepProgram micro_step = remat_step(
          trace_train_step(store, opt, loss_fn, micro_types, options.clip_norm, "TrainStep", options.skip_nonfinite, 1),
          options.remat);
      const std::vector<TensorType> types = store.types();
      plan = solve_auto_once(options.sharding, mesh, store.paths(), types, [&] {
        return solve_train_step(*fwd, micro_step, opt.state_slots(types), types, micro_types, group, options.sharding,
                                options.compile);
      });
      plan.mesh = group;
    }
  }
  int64_t shards = 1;
  for (const std::string& a : plan.batch_axes) shards *= group.axis_size(a);
  for (size_t i = 0; i < batch_types.size(); ++i)
    if (batch_types[i].rank() > 0 && batch_types[i].shape[0] % shards != 0)
      throw UserError(fmt::format(
          "[pipeline] batch array {} ({}) does not split over the {} devices of the batch axes inside a stage: use a "
          "batch size that is a multiple of {}",
          i, type_str(batch_types[i]), shards, shards * M));
  check_rows_per_device(plan, batch_types, M);  // each device's microbatches are made of its own rows

  PipelinedStep r;
  r.state_specs = state_specs_for(plan, opt.state_slots(store.types()), store.types());
  auto cut = [&](StepProgram q, bool compile_it) {
    return stage_programs(std::move(q), schedule, options.pipeline, mesh, plan, r.state_specs, options.compile,
                          options.offload, cluster, compile_it);
  };
  StepProgram p =
      trace_train_step(store, opt, loss_fn, micro_types, options.clip_norm, "TrainStep", options.skip_nonfinite, 1);
  if (options.remat.policy == RematPolicy::automatic) {
    // The least recompute whose busiest device group's planned peak (the schedule's held
    // microbatches included) fits: each candidate cut into stages and planned, nothing compiled.
    auto peak_of = [&](const StepProgram& q) {
      DumpCandidates quiet;
      const PipelineReport rep = pipeline_report(cut(q.clone(), false));
      int64_t peak = 0;
      for (int d = 0; d < rep.schedule.devices; ++d) peak = std::max(peak, rep.planned_peak(d));
      return peak;
    };
    const int64_t budget = options.remat.budget_bytes > 0 ? options.remat.budget_bytes : memory_limit(options, mesh);
    p = remat_automatic(std::move(p), budget, peak_of);
  } else {
    p = remat_step(std::move(p), options.remat);
  }
  dump_pass("remat", [&] { return p.graph->to_string(); });
  r.graph = p.graph->clone();
  r.staged = cut(std::move(p), compile);
  r.plan = std::move(plan);
  r.plan.mesh = mesh;
  for (ParamPlacement& pp : r.plan.params)
    for (size_t st = 0; st < r.staged.stage_layers.size(); ++st)
      for (const std::string& l : r.staged.stage_layers[st])
        if (l == memory_pass::layer_of(pp.path))
          pp.reason =
              fmt::format("stage {} (device group {}), {}", st, schedule.device_of(static_cast<int>(st)), pp.reason);
  return r;
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
  const Mesh mesh = options.mesh ? *options.mesh : Mesh();
  if (options.mesh && pipeline::has_stage_axis(*options.mesh))
    throw UserError(
        "[plan] a mesh with a `stage` axis is planned when its step is built (TrainStep: pipeline_report(); "
        "pax: train with PX_PROFILE=1 writes it to profile.txt); the plan of shardings covers meshes "
        "without one");
  const bool one_device = !options.mesh;
  const bool auto_plan = !one_device && options.strategy == ShardingStrategy::AUTO;
  const bool remat_auto = options.remat.policy == RematPolicy::automatic;
  const std::vector<TensorType> types = store.types();
  const std::vector<optim::StateSlot> slots = opt.state_slots(types);

  // 1. Trace and differentiate.
  DecidedStep d;
  d.program = trace_train_step(store, opt, loss_fn, batch_types, options.clip_norm, "TrainStep", options.skip_nonfinite,
                               options.microbatches);

  // 2-3. Remat and the sharding decision. A recipe's plan needs only the forward program, so it
  // comes first and remat `auto` measures each candidate under it. AUTO plans the whole step, so
  // under remat `auto` it plans the step that saves the least (a plan that fits at all fits with
  // it), and remat `auto` then picks the least recompute that fits under that plan.
  if (one_device) {
    d.plan = one_device_plan(store.paths(), store.types());
  } else {
    DumpCandidates quiet;  // the forward program and AUTO's candidates are not passes of this step
    auto fwd = nn::trace_with_params(
        store, [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss_fn(b)}; }, batch_types);
    if (!auto_plan) {
      d.plan = plan_sharding(*fwd, store.paths(), mesh, options.strategy, options.sharding);
    } else {
      const StepProgram planned_on =
          remat_step(d.program.clone(), remat_auto ? RematOptions{RematPolicy::nothing_saveable, {}} : options.remat);
      d.plan = solve_auto_once(options.sharding, mesh, store.paths(), types, [&] {
        return solve_train_step(*fwd, planned_on, slots, types, batch_types, mesh, options.sharding, options.compile,
                                options.offload);
      });
    }
  }
  check_rows_per_device(d.plan, batch_types, options.microbatches);
  d.state_specs = state_specs_for(d.plan, slots, types);
  if (remat_auto) {
    auto peak_of = [&](const StepProgram& p) {
      DumpCandidates quiet;
      return planned(p, d.plan, d.state_specs, batch_types, options, options.offload).peak_bytes;
    };
    const int64_t budget = options.remat.budget_bytes > 0 ? options.remat.budget_bytes : memory_limit(options, mesh);
    d.program = remat_automatic(std::move(d.program), budget, peak_of);
  } else {
    d.program = remat_step(std::move(d.program), options.remat);
  }
  dump_pass("remat", [&] { return d.program.graph->to_string(); });
  d.decision =
      decide_train_step(d.program, d.plan, d.state_specs, batch_types, bucket_bytes_for(d.plan, options.sharding));
  return d;
}

CompiledStep compile_step(nn::ParamStore& store, const optim::Optimizer& opt, const TrainStep::LossFn& loss_fn,
                          const std::vector<TensorType>& batch_types, const TrainStepOptions& options) {
  DumpProgram dump("train_step");
  if (options.mesh && pipeline::has_stage_axis(*options.mesh))
    return compile_pipelined(store, opt, loss_fn, batch_types, options);
  // 1-3. Trace, remat, decide. AUTO may pipeline the mesh's devices instead (auto_pipeline), unless
  // the user's rules name the mesh's axes.
  const bool try_pipeline = options.mesh && options.strategy == ShardingStrategy::AUTO &&
                            options.sharding.auto_pipeline && options.mesh->num_processes() == 1 &&
                            options.sharding.rules.empty() && options.sharding.activation_rules.empty();
  DecidedStep d;
  std::optional<UserError> flat_error;
  try {
    d = decide_step(store, opt, loss_fn, batch_types, options);
  } catch (const UserError& e) {
    if (!try_pipeline) throw;
    flat_error = e;  // nothing fits as given: a pipeline may
  }
  if (try_pipeline) {
    std::string why;
    const double flat_s = flat_error ? std::numeric_limits<double>::infinity() : d.plan.predicted_step_s;
    if (std::optional<TrainStepOptions> piped =
            faster_pipeline(store, opt, loss_fn, batch_types, options, flat_s, why)) {
      CompiledStep c = compile_pipelined(store, opt, loss_fn, batch_types, *piped);
      c.plan.explanation = why + (flat_error ? "" : d.plan.explanation);
      return c;
    }
    if (flat_error) throw *flat_error;
  }
  const Mesh& mesh = d.plan.mesh;

  // 4-5. Partition (dumped as sharding_decision, annotate, partition) and offload.
  LoweredStep l = lower(d.program, d.plan, d.state_specs, batch_types, options, options.offload);

  // 6. The memory check, before anything is allocated: over the limit, say what would fit.
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

  // 7. Compile: autocast, cse + dce, schedule and fusion, collective lowering, buffer plan. The
  // program is the whole step, the one stage of a pipeline of one stage.
  PipelinedStep b;
  b.plan = std::move(d.plan);
  b.state_specs = std::move(d.state_specs);
  b.staged = one_stage(d.program.graph->clone(),
                       ShardedExecutable::compile(std::move(l.local), l.compile, options.sharding.device_parallelism,
                                                  options.sharding.communicator),
                       d.program.n_params, d.program.n_state);
  b.graph = std::move(d.program.graph);
  return compiled(std::move(b), options);
}

}  // namespace px::detail
