// Executable: the schedule (runtime/schedule.h), one buffer plan for the whole program
// (runtime/plan.h), and a run loop that only calls prepared kernels and collectives on
// precomputed pointers. One program runs on one or several devices of this process in lockstep:
// each device has its own arena and kernel instances, the schedule and plan are shared. The
// devices are the communicator's local participants (every mesh position in one process, or one
// process's positions of a mesh that spans several); collectives pass one buffer per local device.
#include "parallax/runtime.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>

#include "core/dump.h"
#include "core/env.h"
#include "core/exclusive.h"
#include "core/log.h"
#include "ir/primitive.h"
#include "parallax/backend.h"
#include "parallax/passes.h"
#include "runtime/compile_passes.h"
#include "runtime/order.h"
#include "runtime/plan.h"
#include "runtime/program.h"
#include "runtime/schedule.h"

namespace px {

namespace {

// One schedule unit as one device runs it.
struct Step {
  Kernel kernel;  // empty for views and collective events
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
};

// A pointer slot of a step that is patched at every run: operand k (or result k when out).
struct Ref {
  int step, k;
  bool out;
};

}  // namespace

struct Executable::Impl {
  std::unique_ptr<Graph> graph;
  std::vector<Unit> units;
  int fused_groups = 0;
  std::vector<int> root;  // value -> the value whose storage it shares (reshapes are views)
  // Buffers of the plan: ids [0, values) are values (by root), then collective packing scratch and
  // the kernels' scratch.
  std::vector<int64_t> buffer_bytes;
  BufferPlan plan;       // device memory
  BufferPlan host_plan;  // pinned_host memory (offload); empty when nothing lives there
  std::vector<MemoryCategory> buffer_category;
  std::vector<MemoryKind> buffer_kind;
  std::vector<MemoryKind> input_kind, output_kind;
  // Collectives: the op, and per unit the collective it starts or waits (-1 for compute).
  std::vector<CollectiveOp> colls;
  std::vector<int> coll_of_unit;
  std::vector<std::vector<int>> scratch_of;  // per collective: its packing scratch buffer ids
  std::vector<int> kernel_scratch;           // per unit: its kernel's scratch buffer id, or -1
  // Blocks of the run loop: a run of compute units, or one collective event.
  struct Block {
    int begin, end;
    bool collective;
  };
  std::vector<Block> blocks;
  // Graph inputs live in the caller's arrays: where each is read, and the last step reading it.
  std::vector<std::vector<Ref>> input_refs;
  std::vector<int> input_last_step;
  std::vector<char> input_is_output;
  // Values computed by the step and returned are written straight into the caller's output
  // arrays ("homes"), unless that array overlaps another argument: then into a spill buffer.
  struct Home {
    int value, pos, producer_step;
    int64_t nbytes;
    std::vector<Ref> refs;
  };
  std::vector<Home> homes;
  std::vector<int> home_at_pos;  // output position -> home index, or -1 (input or repeated value)
  std::vector<int> output_values;
  std::vector<int> output_donor;  // per output: the donated input it is written into, or -1
  // Donated outputs whose input is read after they are written: computed into the arena (planned),
  // copied into the caller's array at the end of the run.
  struct CopyAtEnd {
    int value, pos;
  };
  std::vector<CopyAtEnd> copies_at_end;
  int64_t input_bytes = 0, output_bytes = 0;
  MemoryReport report;

  struct Range {
    const std::byte *lo, *hi;
    int pos;  // output position, or -1 - input index
  };
  struct Device {
    int id = 0;
    std::byte* arena = nullptr;
    bool own_arena = true;  // false: the caller's (use_arena)
    std::byte* host_arena = nullptr;
    std::vector<Step> steps;
    std::vector<Ref> arena_slots;  // the steps' pointers into the device arena
    std::vector<std::byte*> spill;  // per home, allocated on the first run that needs it
    std::vector<char> spilled;      // per home, this run
    std::vector<Range> ranges;      // run-time scratch, reserved at compile time
  };
  std::vector<Device> devices;
  Communicator* comm = nullptr;
  Backend* backend = &cpu_backend();
  std::string platform = "cpu";  // the backend's: its devices' memory (Placement::platform)
  Placement at(int device, MemoryKind kind = MemoryKind::device) const { return {device, kind, platform}; }
  bool over_devices = false;
  // The devices' memory is not the host's and the communicator reads host memory: collectives are
  // staged through host buffers (start_collective).
  bool stage_collectives = false;
  std::vector<CollectiveHandle> handles;  // per collective, between its start and its wait
  std::vector<double> step_seconds;       // per unit, summed over runs; empty unless profiling
  std::vector<double> first_run_seconds;  // per unit, the first run's (one-time costs: page faults, JIT)
  int profiled_runs = 0;
  void end_run() {
    if (step_seconds.empty()) return;
    if (++profiled_runs == 1) first_run_seconds = step_seconds;
  }
  // Per unit, the mean seconds of a run: over the runs after the first once there are any.
  double mean_seconds(size_t s) const {
    if (profiled_runs <= 1) return step_seconds[s];
    return (step_seconds[s] - first_run_seconds[s]) / (profiled_runs - 1);
  }
  // The last profiled run's timeline: per unit, when it began and ended (seconds since the run
  // started; -1 before the first run).
  std::vector<double> unit_begin, unit_end;
  std::chrono::steady_clock::time_point run_start;
  void begin_run() {
    if (!step_seconds.empty()) run_start = std::chrono::steady_clock::now();
  }
  double since_start() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  }
  std::atomic<bool> running{false};  // one call at a time: run patches pointers in place

  ~Impl() {
    wait_pending();  // a run that threw may have left copies in flight into the arenas
    for (Device& d : devices) {
      if (d.own_arena) free_bytes(at(d.id), d.arena, plan.peak_bytes);
      free_bytes(at(d.id, MemoryKind::pinned_host), d.host_arena, host_plan.peak_bytes);
      for (size_t h = 0; h < d.spill.size(); ++h)
        free_bytes(at(d.id, output_kind[homes[h].pos]), d.spill[h], homes[h].nbytes);
    }
  }
  // Copies still in flight write into the arenas: wait for them (a collective left pending by a
  // failed run is not waited: its peers may be gone).
  void wait_pending() {
    for (size_t c = 0; c < handles.size() && c < colls.size(); ++c) {
      if (!colls[c].transfer || !handles[c].pending()) continue;
      try {
        handles[c].wait();
      } catch (...) {
      }
    }
  }

  void bind(Device& dev, const std::vector<Array>& inputs, std::vector<Array>& outputs);
  void finish(const std::vector<Array>& inputs, std::vector<Array>& outputs, Device& dev);
  void run_block(const Block& b);
  void run_collective(int unit);
  void check_args(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const;
};

Executable::Executable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executable::~Executable() = default;
std::unique_ptr<Executable> make_executable(std::unique_ptr<Executable::Impl> impl) {
  return std::unique_ptr<Executable>(new Executable(std::move(impl)));
}

std::unique_ptr<Executable> Executable::compile(const Graph& src, const CompileOptions& opt) {
  return compile_on_devices(src, opt, DeviceSetup{});
}

namespace {

// Everything compile decides before it allocates: the prepared graph, the schedule, the
// collectives, the buffer plan and the memory report (with the memory limit checked). Shared by
// compile_on_devices and plan_program, so that a planned program is exactly what would run. The
// passes in order (runtime/compile_passes.h says where each lives):
std::unique_ptr<Executable::Impl> plan_impl(const Graph& src, const CompileOptions& opt,
                                            const std::function<CollectiveGroups(const Node&)>& groups) {
  using Impl = Executable::Impl;
  auto impl = std::make_unique<Impl>();
  impl->backend = &backend_for(opt.platform);
  impl->platform = opt.platform;
  src.verify();
  impl->graph = simplify(src, opt);
  Graph& g = *impl->graph;
  place_values(g);
  if (opt.update_as_gradients_complete)
    if (std::unique_ptr<Graph> early = update_as_gradients_complete(g)) g = std::move(*early);
  if (opt.optimize) dump_pass("optimize", [&] { return g.to_string(); });

  ScheduleOptions so;
  so.backend = impl->backend;
  so.fuse_elementwise = opt.fuse_elementwise;
  so.collective_lookahead = opt.collective_lookahead;
  so.prefetch_depth = opt.prefetch_depth;
  impl->units = make_schedule(g, so);
  dump_pass("schedule", [&] { return schedule_text(impl->units); });

  ProgramBuffers buffers = value_buffers(g, impl->units);
  LoweredCollectives colls = lower_collectives(g, impl->units, groups, buffers);
  kernel_scratch(g, impl->units, *impl->backend, impl->at(0), buffers);
  const Donation donation = donate(g, impl->units, buffers, opt.output_donors);

  // Returned values: the first position of each computed value is its home (caller memory).
  const size_t nv = g.values().size();
  std::vector<int> home_of(nv, -1);
  impl->output_values = g.outputs();
  impl->output_donor = donation.output_donor;
  impl->home_at_pos.assign(g.outputs().size(), -1);
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const int v = g.outputs()[o];
    impl->output_bytes += g.type(v).nbytes();
    if (donation.copy_at_end[o]) {
      impl->copies_at_end.push_back({v, static_cast<int>(o)});
      continue;
    }
    if (g.values()[v].producer < 0 || home_of[v] >= 0) continue;
    home_of[v] = static_cast<int>(impl->homes.size());
    impl->home_at_pos[o] = home_of[v];
    impl->homes.push_back({v, static_cast<int>(o), -1, g.type(v).nbytes(), {}});
  }
  for (int v : g.inputs()) impl->input_bytes += g.type(v).nbytes();
  std::vector<char> external(buffers.bytes.size(), 0);  // inputs and homes live in caller memory
  for (int v : g.inputs()) external[v] = 1;
  for (const Impl::Home& h : impl->homes) external[h.value] = 1;

  ArenaPlans plans = plan_arenas(g, impl->units, buffers, colls, external);
  impl->report = memory_report(g, impl->units, buffers, colls, donation, plans, opt.one_forward_pass);
  check_limits(impl->report, opt, g, buffers, plans);

  for (int v : g.inputs()) impl->input_kind.push_back(g.values()[v].kind);
  for (int v : g.outputs()) impl->output_kind.push_back(g.values()[v].kind);
  impl->root = std::move(buffers.root);
  impl->buffer_bytes = std::move(buffers.bytes);
  impl->buffer_category = std::move(buffers.category);
  impl->buffer_kind = std::move(buffers.kind);
  impl->colls = std::move(colls.ops);
  impl->coll_of_unit = std::move(colls.of_unit);
  impl->scratch_of = std::move(colls.scratch_of);
  impl->kernel_scratch = std::move(buffers.kernel_scratch);
  impl->plan = std::move(plans.device);
  impl->host_plan = std::move(plans.host);
  impl->handles.resize(impl->colls.size());
  // Blocks of the run loop: runs of compute units between collective events.
  for (size_t u = 0; u < impl->units.size();) {
    size_t e = u + 1;
    const bool collective = impl->coll_of_unit[u] >= 0;
    if (!collective)
      while (e < impl->units.size() && impl->coll_of_unit[e] < 0) ++e;
    impl->blocks.push_back({static_cast<int>(u), static_cast<int>(e), collective});
    u = e;
  }
  return impl;
}

}  // namespace

PlannedProgram plan_program(const Graph& g, const CompileOptions& opt,
                            const std::function<CollectiveGroups(const Node&)>& groups) {
  auto impl = plan_impl(g, opt, groups);
  PlannedProgram p;
  p.graph = std::move(impl->graph);
  p.units = std::move(impl->units);
  p.collectives = std::move(impl->colls);
  p.collective_of_unit = std::move(impl->coll_of_unit);
  p.report = impl->report;
  return p;
}

namespace {

// The options with the memory limits lowered to the devices' capacities (what the plan may use).
CompileOptions limited_by_capacity(const CompileOptions& opt, const std::vector<int>& device_ids) {
  CompileOptions limited = opt;
  for (int id : device_ids)
    for (auto [kind, limit] : {std::pair{MemoryKind::device, &limited.memory_limit_bytes},
                               std::pair{MemoryKind::pinned_host, &limited.host_memory_limit_bytes}}) {
      const int64_t cap = memory_capacity({id, kind, opt.platform});
      if (cap > 0 && (*limit == 0 || cap < *limit)) *limit = cap;
    }
  return limited;
}

// Kernels and arenas per device, each step's pointers at its arena offsets (in_off / out_off:
// >= 0 the device arena, <= -2 the host arena at -2 - offset, -1 patched at every run). Kernels
// hold per-thread scratch, so devices that run at the same time need their own instances; devices
// run one after the other share them.
void make_devices(Executable::Impl& impl, const DeviceSetup& setup, const std::vector<std::vector<int64_t>>& in_off,
                  const std::vector<std::vector<int64_t>>& out_off) {
  const Graph& g = *impl.graph;
  for (size_t d = 0; d < setup.device_ids.size(); ++d) {
    // Held by impl from the start: its destructor frees the arena if a kernel lookup below throws.
    impl.devices.emplace_back();
    Executable::Impl::Device& dev = impl.devices.back();
    dev.id = setup.device_ids[d];
    dev.arena = static_cast<std::byte*>(allocate_bytes(impl.at(dev.id), impl.plan.peak_bytes));
    if (impl.host_plan.peak_bytes > 0)
      dev.host_arena = static_cast<std::byte*>(
          allocate_bytes(impl.at(dev.id, MemoryKind::pinned_host), impl.host_plan.peak_bytes));
    dev.spill.assign(impl.homes.size(), nullptr);
    dev.spilled.assign(impl.homes.size(), 0);
    dev.ranges.reserve(g.inputs().size() + g.outputs().size());
    for (size_t s = 0; s < impl.units.size(); ++s) {
      const Unit& unit = impl.units[s];
      Step st;
      if (d > 0 && !impl.over_devices && !impl.backend->kernels_per_device()) {
        st.kernel = impl.devices[0].steps[s].kernel;
      } else if (unit.kind == Unit::Kind::fused || unit.kind == Unit::Kind::kernel) {
        st.kernel = impl.backend->make_kernel(g, unit, impl.at(dev.id));
      }
      auto ptr = [&](int64_t off) -> std::byte* {
        return off >= 0 ? dev.arena + off : off <= -2 ? dev.host_arena + (-2 - off) : nullptr;
      };
      for (int64_t off : in_off[s]) {
        if (off >= 0) dev.arena_slots.push_back({static_cast<int>(s), static_cast<int>(st.in_ptrs.size()), false});
        st.in_ptrs.push_back(ptr(off));
      }
      for (int64_t off : out_off[s]) {
        if (off >= 0) dev.arena_slots.push_back({static_cast<int>(s), static_cast<int>(st.out_ptrs.size()), true});
        st.out_ptrs.push_back(ptr(off));
      }
      dev.steps.push_back(std::move(st));
    }
  }
}

}  // namespace

std::unique_ptr<Executable> compile_on_devices(const Graph& src, const CompileOptions& opt, const DeviceSetup& setup) {
  using Impl = Executable::Impl;
  apply_thread_settings();
  if (setup.device_ids.empty()) throw Error("[compile] internal: no devices to compile for");
  std::unique_ptr<Impl> impl = plan_impl(src, limited_by_capacity(opt, setup.device_ids), setup.groups);
  bool has_collectives = false;
  for (const CollectiveOp& c : impl->colls) has_collectives = has_collectives || !c.transfer;
  if (has_collectives && !setup.comm)
    throw Error(
        "[compile] the program has collectives but no communicator to run them: compile it for a mesh "
        "with px::ShardedExecutable, not px::Executable");
  const Graph& g = *impl->graph;
  const size_t nv = g.values().size();
  const std::vector<int>& root = impl->root;
  const std::vector<std::vector<int>>& scratch_of = impl->scratch_of;
  std::vector<char> external(impl->buffer_bytes.size(), 0);
  for (int v : g.inputs()) external[v] = 1;
  for (const Impl::Home& h : impl->homes) external[h.value] = 1;
  std::vector<int> home_of(nv, -1);
  for (size_t h = 0; h < impl->homes.size(); ++h) home_of[impl->homes[h].value] = static_cast<int>(h);

  // Pointer slots: arena offsets now, caller memory patched at every run.
  std::vector<int> input_index(nv, -1);
  for (size_t i = 0; i < g.inputs().size(); ++i) input_index[g.inputs()[i]] = static_cast<int>(i);
  impl->input_refs.resize(g.inputs().size());
  impl->input_last_step.assign(g.inputs().size(), -1);
  impl->input_is_output.assign(g.inputs().size(), 0);
  for (int v : g.outputs())
    if (input_index[v] >= 0) impl->input_is_output[input_index[v]] = 1;
  // Arena offsets per operand and result; -1: patched at every run. Host-arena offsets are stored
  // as -2 - offset.
  std::vector<std::vector<int64_t>> in_off(impl->units.size()), out_off(impl->units.size());
  auto offset_of = [&](int b) -> int64_t {
    if (external[b]) return -1;
    if (impl->plan.offset[b] >= 0) return impl->plan.offset[b];
    return impl->host_plan.offset[b] >= 0 ? -2 - impl->host_plan.offset[b] : -1;
  };
  for (size_t s = 0; s < impl->units.size(); ++s) {
    const Unit& unit = impl->units[s];
    const int si = static_cast<int>(s);
    if (unit.kind == Unit::Kind::view) continue;
    for (size_t k = 0; k < unit.in_values.size(); ++k) {
      int r = root[unit.in_values[k]], ki = static_cast<int>(k);
      if (input_index[r] >= 0) {
        impl->input_refs[input_index[r]].push_back({si, ki, false});
        impl->input_last_step[input_index[r]] = si;
      } else if (home_of[r] >= 0) {
        impl->homes[home_of[r]].refs.push_back({si, ki, false});
      }
      in_off[s].push_back(offset_of(r));
    }
    std::vector<int> outs = unit.out_values;
    if (impl->coll_of_unit[s] >= 0 && unit.kind == Unit::Kind::collective_start)
      outs.insert(outs.end(), scratch_of[impl->coll_of_unit[s]].begin(), scratch_of[impl->coll_of_unit[s]].end());
    if (impl->kernel_scratch[s] >= 0) outs.push_back(impl->kernel_scratch[s]);  // after the results
    for (size_t k = 0; k < outs.size(); ++k) {
      int v = outs[k];
      if (v < static_cast<int>(nv) && home_of[v] >= 0) {
        impl->homes[home_of[v]].refs.push_back({si, static_cast<int>(k), true});
        if (impl->homes[home_of[v]].producer_step < 0) impl->homes[home_of[v]].producer_step = si;
      }
      out_off[s].push_back(offset_of(v));
    }
  }

  if (setup.comm && setup.comm->local_positions().size() != setup.device_ids.size())
    throw Error("[compile] internal: " + std::to_string(setup.device_ids.size()) +
                " devices but the communicator has " + std::to_string(setup.comm->local_positions().size()) +
                " local participants");
  impl->comm = setup.comm;
  if (impl->comm) {  // collectives run on the streams of the devices they are for
    std::vector<void*> streams;
    for (int id : setup.device_ids) streams.push_back(impl->backend->stream(impl->at(id)));
    impl->comm->bind_streams(std::move(streams));
  }
  impl->over_devices = setup.over_devices && setup.device_ids.size() > 1;
  impl->stage_collectives = impl->comm && !impl->comm->reads_device_memory() &&
                            !impl->backend->host_visible(impl->at(setup.device_ids[0]));
  make_devices(*impl, setup, in_off, out_off);
  for (const Unit& u : impl->units) impl->fused_groups += u.kind == Unit::Kind::fused;
  if (opt.profile || env().profile) {
    impl->step_seconds.assign(impl->units.size(), 0.0);
    impl->unit_begin.assign(impl->units.size(), -1.0);
    impl->unit_end.assign(impl->units.size(), -1.0);
  }
  auto exe = make_executable(std::move(impl));
  PX_LOG(debug) << "compiled " << exe->graph().nodes().size() << " nodes\n" << exe->summary();
  dump_pass("buffer_plan", [&] { return exe->memory().to_string() + exe->summary(); });
  return exe;
}

void Executable::Impl::check_args(const std::vector<Array>& inputs, const std::vector<Array>& outputs) const {
  const Graph& g = *graph;
  if (inputs.size() != g.inputs().size())
    throw Error("[run] expected " + std::to_string(g.inputs().size()) + " inputs, got " +
                std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = g.type(g.inputs()[i]);
    auto name = [&] { return g.input_names()[i].empty() ? std::string() : " ('" + g.input_names()[i] + "')"; };
    if (inputs[i].type() != want)
      throw Error("[run] input " + std::to_string(i) + name() + " has type " + type_str(inputs[i].type()) +
                  " but the graph was traced with " + type_str(want));
    if (!inputs[i].defined())
      throw Error("[run] input " + std::to_string(i) + name() + " is an empty px::Array (no data)");
    if (inputs[i].placement().kind != input_kind[i] || inputs[i].placement().platform != platform)
      throw Error("[run] input " + std::to_string(i) + name() + " is in " + inputs[i].placement().to_string() +
                  " memory but the program reads it from " +
                  at(inputs[i].placement().device, input_kind[i]).to_string() +
                  " memory (Executable::input_kind): copy it there, e.g. array.to({device, px::MemoryKind::" +
                  memory_kind_name(input_kind[i]) + ", \"" + platform + "\"})");
  }
  if (outputs.size() != output_values.size())
    throw Error("[run] expected " + std::to_string(output_values.size()) + " output arrays, got " +
                std::to_string(outputs.size()));
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = output_values[o];
    if (outputs[o].type() != g.type(v) || !outputs[o].defined())
      throw Error("[run] output array " + std::to_string(o) + " has type " + type_str(outputs[o].type()) +
                  (outputs[o].defined() ? "" : " and no data") + ", expected " + type_str(g.type(v)));
    if (outputs[o].read_only())
      throw UserError("[run] output array " + std::to_string(o) +
                      " is read-only memory adopted from another library (Array::adopt), which a program never "
                      "writes: pass an Array of its own (or donate a writable copy, Array::clone)");
    if (outputs[o].placement().kind != output_kind[o] || outputs[o].placement().platform != platform)
      throw Error("[run] output array " + std::to_string(o) + " is in " + outputs[o].placement().to_string() +
                  " memory but the program writes it to " +
                  at(outputs[o].placement().device, output_kind[o]).to_string() + " memory (Executable::output_kind)");
    for (size_t p = 0; p < o; ++p)
      if (outputs[p].nbytes() > 0 && outputs[p].raw() == outputs[o].raw())
        throw Error("[run] output arrays " + std::to_string(p) + " and " + std::to_string(o) +
                    " share one buffer, so one result would overwrite the other; pass distinct arrays");
  }
}

// Points the device's steps at the caller's arrays for this run.
void Executable::Impl::bind(Device& dev, const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  auto patch = [&](const std::vector<Ref>& refs, void* p) {
    for (const Ref& r : refs) {
      if (r.out)
        dev.steps[r.step].out_ptrs[r.k] = p;
      else
        dev.steps[r.step].in_ptrs[r.k] = p;
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i) patch(input_refs[i], const_cast<void*>(inputs[i].raw()));

  // A home whose array overlaps another argument is spilled, except for an in-place update: the
  // home is exactly an input's array and that input is no longer read when the home is written.
  std::fill(dev.spilled.begin(), dev.spilled.end(), 0);
  dev.ranges.clear();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].nbytes() > 0) {
      auto lo = static_cast<const std::byte*>(inputs[i].raw());
      dev.ranges.push_back({lo, lo + inputs[i].nbytes(), -1 - static_cast<int>(i)});
    }
  for (size_t o = 0; o < outputs.size(); ++o)
    if (outputs[o].nbytes() > 0) {
      auto lo = static_cast<const std::byte*>(outputs[o].raw());
      dev.ranges.push_back({lo, lo + outputs[o].nbytes(), static_cast<int>(o)});
    }
  std::sort(dev.ranges.begin(), dev.ranges.end(), [](const Range& a, const Range& b) { return a.lo < b.lo; });
  for (size_t a = 0; a < dev.ranges.size(); ++a)
    for (size_t b = a + 1; b < dev.ranges.size() && dev.ranges[b].lo < dev.ranges[a].hi; ++b) {
      const Range &x = dev.ranges[a], &y = dev.ranges[b];
      for (const Range* r : {&x, &y}) {
        const Range* other = r == &x ? &y : &x;
        if (r->pos < 0 || home_at_pos[r->pos] < 0) continue;
        int h = home_at_pos[r->pos];
        int last = other->pos < 0 ? input_last_step[-1 - other->pos] : 0;
        int prod = homes[h].producer_step;
        bool in_place = other->pos < 0 && other->lo == r->lo && other->hi == r->hi &&
                        (last < prod || (last == prod && units[last].alias_safe)) && !input_is_output[-1 - other->pos];
        if (!in_place) dev.spilled[h] = 1;
      }
    }
  for (size_t h = 0; h < homes.size(); ++h) {
    void* dst = outputs[homes[h].pos].raw();
    if (dev.spilled[h]) {
      if (!dev.spill[h])  // first run with this aliasing: allocate once, reuse afterwards
        dev.spill[h] = static_cast<std::byte*>(allocate_bytes(at(dev.id, output_kind[homes[h].pos]), homes[h].nbytes));
      dst = dev.spill[h];
    }
    patch(homes[h].refs, dst);
  }
}

// Copies what the steps did not write in place: inputs returned as outputs, spilled homes, and
// values returned at several positions; through the backend, in this order (a spilled home may
// overwrite an input returned as an output, which is copied first).
void Executable::Impl::finish(const std::vector<Array>& inputs, std::vector<Array>& outputs, Device& dev) {
  const Graph& g = *graph;
  std::vector<CopyJob> jobs;
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = root[output_values[o]];
    if (g.values()[v].producer >= 0 || outputs[o].nbytes() == 0) continue;
    const void* src = inputs[g.values()[v].output_index].raw();
    if (src != outputs[o].raw()) jobs.push_back({outputs[o].raw(), src, outputs[o].nbytes()});
  }
  for (const CopyAtEnd& c : copies_at_end) {
    const int b = root[c.value];
    if (plan.offset[b] < 0 && host_plan.offset[b] < 0) continue;  // also returned at a home: copied below
    const std::byte* src = plan.offset[b] >= 0 ? dev.arena + plan.offset[b] : dev.host_arena + host_plan.offset[b];
    if (outputs[c.pos].nbytes()) jobs.push_back({outputs[c.pos].raw(), src, outputs[c.pos].nbytes()});
  }
  for (size_t h = 0; h < homes.size(); ++h)
    if (dev.spilled[h] && homes[h].nbytes) jobs.push_back({outputs[homes[h].pos].raw(), dev.spill[h], homes[h].nbytes});
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = output_values[o];
    if (g.values()[v].producer < 0 || home_at_pos[o] >= 0 || outputs[o].nbytes() == 0) continue;
    for (const Home& h : homes)
      if (h.value == v && outputs[h.pos].raw() != outputs[o].raw())
        jobs.push_back({outputs[o].raw(), outputs[h.pos].raw(), outputs[o].nbytes()});
  }
  if (!jobs.empty()) backend->copy(std::move(jobs)).wait();
}

void Executable::Impl::run_collective(int u) {
  const int c = coll_of_unit[u];
  if (units[u].kind == Unit::Kind::collective_wait) {
    handles[c].wait();
    return;
  }
  const size_t D = devices.size();
  if (colls[c].transfer) {
    std::vector<CopyJob> jobs;
    const int64_t bytes = numel(colls[c].in_shape) * dtype_size(colls[c].dtype);
    for (size_t d = 0; d < D; ++d)
      jobs.push_back({devices[d].steps[u].out_ptrs[0], devices[d].steps[u].in_ptrs[0], bytes});
    handles[c] = backend->copy(std::move(jobs));
    return;
  }
  Buffers ins(D);
  MutBuffers outs(D), s_in(D), s_out(D);
  const CollectiveOp& op = colls[c];
  for (size_t d = 0; d < D; ++d) {
    const Step& st = devices[d].steps[u];
    ins[d] = st.in_ptrs[0];
    outs[d] = st.out_ptrs[0];
    size_t k = 1;
    if (op.scratch_in) s_in[d] = st.out_ptrs[k++];
    if (op.scratch_out) s_out[d] = st.out_ptrs[k++];
  }
  handles[c] = start_collective(*comm, *backend, op, ins, outs, s_in, s_out, stage_collectives);
}

void Executable::Impl::run_block(const Block& b) {
  if (b.collective) {
    if (step_seconds.empty()) {
      run_collective(b.begin);
      return;
    }
    // Timed like a kernel: a start is the time to issue, a wait the time the device stood still.
    unit_begin[b.begin] = since_start();
    run_collective(b.begin);
    unit_end[b.begin] = since_start();
    step_seconds[b.begin] += unit_end[b.begin] - unit_begin[b.begin];
    return;
  }
  auto run_units = [&](Device& dev, int begin, int end) {
    for (int s = begin; s < end; ++s) {
      Step& st = dev.steps[s];
      if (st.kernel) st.kernel(st.in_ptrs.data(), st.out_ptrs.data());
    }
  };
  auto run_all = [&](int begin, int end) {
    if (!over_devices) {
      for (Device& dev : devices) run_units(dev, begin, end);
      return;
    }
    // By reference: a std::function holding a reference_wrapper does not allocate (this runs every block).
    const auto body = [&](int d) { run_units(devices[d], begin, end); };
    backend->for_each_device(static_cast<int>(devices.size()), std::cref(body));
  };
  if (step_seconds.empty()) {
    run_all(b.begin, b.end);
    return;
  }
  for (int s = b.begin; s < b.end; ++s) {
    unit_begin[s] = since_start();
    run_all(s, s + 1);
    unit_end[s] = since_start();
    step_seconds[s] += unit_end[s] - unit_begin[s];
  }
}

std::vector<Array> Executable::run(const std::vector<Array>& in) {
  // Inputs in another memory kind (e.g. params a training step keeps offloaded), or of another
  // platform, are copied to where the program reads them, for this call.
  std::vector<Array> inputs = in;
  for (size_t i = 0; i < inputs.size() && i < impl_->input_kind.size(); ++i)
    if (inputs[i].defined() &&
        (inputs[i].placement().kind != impl_->input_kind[i] || inputs[i].placement().platform != impl_->platform))
      inputs[i] = inputs[i].to(impl_->at(inputs[i].placement().device, impl_->input_kind[i]));
  // A donated input's array takes its output (CompileOptions::output_donors).
  std::vector<Array> outs;
  for (int v : impl_->output_values) {
    const int donor = impl_->output_donor[outs.size()];
    if (donor >= 0 && donor < static_cast<int>(inputs.size()) && inputs[donor].defined() &&
        !inputs[donor].read_only() && inputs[donor].placement().kind == impl_->output_kind[outs.size()] &&
        inputs[donor].type() == impl_->graph->type(v))
      outs.push_back(inputs[donor]);
    else
      outs.emplace_back(impl_->graph->type(v).dtype, impl_->graph->type(v).shape,
                        impl_->at(impl_->devices[0].id, impl_->output_kind[outs.size()]));
  }
  run_into(inputs, outs);
  return outs;
}

void Executable::run_into(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  if (impl_->devices.size() != 1)
    throw Error("[run] this program runs on " + std::to_string(impl_->devices.size()) +
                " devices: use run_on_devices (or the ShardedExecutable that compiled it)");
  Impl& im = *impl_;
  ExclusiveCall call(im.running, "executable");
  im.check_args(inputs, outputs);
  im.bind(im.devices[0], inputs, outputs);
  im.wait_pending();
  apply_thread_settings();
  im.begin_run();
  for (const Impl::Block& b : im.blocks) im.run_block(b);
  im.end_run();
  im.finish(inputs, outputs, im.devices[0]);
}

void Executable::run_on_devices(const std::vector<std::vector<Array>>& inputs,
                                std::vector<std::vector<Array>>& outputs) {
  Impl& im = *impl_;
  ExclusiveCall call(im.running, "executable");
  if (inputs.size() != im.devices.size() || outputs.size() != im.devices.size())
    throw Error("[run] expected input and output lists for " + std::to_string(im.devices.size()) + " devices");
  for (size_t d = 0; d < im.devices.size(); ++d) {
    im.check_args(inputs[d], outputs[d]);
    im.bind(im.devices[d], inputs[d], outputs[d]);
  }
  im.wait_pending();
  apply_thread_settings();
  im.begin_run();
  for (const Impl::Block& b : im.blocks) im.run_block(b);
  im.end_run();
  for (size_t d = 0; d < im.devices.size(); ++d) im.finish(inputs[d], outputs[d], im.devices[d]);
}

int64_t Executable::peak_bytes() const { return impl_->plan.peak_bytes; }

void Executable::use_arena(int device_id, void* arena) {
  if (impl_->running.load()) throw Error("[Executable] use_arena while the executable runs");
  for (Impl::Device& d : impl_->devices) {
    if (d.id != device_id) continue;
    std::byte* to = static_cast<std::byte*>(arena);
    if (to == d.arena || impl_->plan.peak_bytes == 0) return;
    for (const Ref& r : d.arena_slots) {
      Step& st = d.steps[r.step];
      if (r.out)
        st.out_ptrs[r.k] = to + (static_cast<std::byte*>(st.out_ptrs[r.k]) - d.arena);
      else
        st.in_ptrs[r.k] = to + (static_cast<const std::byte*>(st.in_ptrs[r.k]) - d.arena);
    }
    if (d.own_arena) free_bytes(impl_->at(d.id), d.arena, impl_->plan.peak_bytes);
    d.arena = to;
    d.own_arena = false;
    return;
  }
  throw Error("[Executable] use_arena: device " + std::to_string(device_id) + " is not one of this executable's");
}
MemoryKind Executable::input_kind(int i) const { return impl_->input_kind.at(i); }
MemoryKind Executable::output_kind(int o) const { return impl_->output_kind.at(o); }
int Executable::output_donor(int o) const { return impl_->output_donor.at(o); }
MemoryReport Executable::memory() const { return impl_->report; }
int64_t Executable::output_bytes() const { return impl_->output_bytes; }
int Executable::num_steps() const {
  int n = 0;
  for (const Unit& u : impl_->units) n += u.kind == Unit::Kind::kernel || u.kind == Unit::Kind::fused;
  return n;
}
int Executable::num_fused_groups() const { return impl_->fused_groups; }
int Executable::num_devices() const { return static_cast<int>(impl_->devices.size()); }
const Graph& Executable::graph() const { return *impl_->graph; }

std::string Executable::profile_report(int top) const {
  const Impl& im = *impl_;
  if (im.step_seconds.empty()) return "profiling is off: compile with CompileOptions::profile or set PX_PROFILE=1\n";
  if (im.profiled_runs == 0) return "no runs profiled yet\n";
  // Aggregate by kernel label (fused groups by their op list).
  std::map<std::string, std::pair<double, int>> by_label;
  double total = 0;
  for (size_t s = 0; s < im.units.size(); ++s) {
    if (im.units[s].kind == Unit::Kind::view) continue;
    auto& e = by_label[im.units[s].label];
    e.first += im.mean_seconds(s);
    e.second += 1;
    total += im.mean_seconds(s);
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_label.begin(), by_label.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  std::ostringstream os;
  // The first run is left out once there are others: it pays for first-touch page faults and code
  // generation, which a long run does not see again.
  if (im.profiled_runs > 1)
    os << "profile: " << im.profiled_runs - 1 << " runs after the first, ";
  else
    os << "profile: 1 run, ";
  os << total * 1e3 << " ms per run in kernels and collectives\n";
  if (!im.colls.empty()) {
    const Timeline t = timeline();
    os << "  last run: " << t.in_flight.size() << " collectives and transfers in flight for " << t.in_flight_s * 1e3
       << " ms, " << t.exposed_s * 1e3
       << " ms of it on the device's thread (starting or waiting): " << 100.0 * t.overlap()
       << "% overlapped with compute\n";
  }
  for (size_t i = 0; i < rows.size() && static_cast<int>(i) < top; ++i)
    os << "  " << rows[i].second.first * 1e3 << " ms  " << 100.0 * rows[i].second.first / total << "%  x"
       << rows[i].second.second << "  " << rows[i].first.substr(0, 100) << "\n";
  return os.str();
}

Timeline Executable::timeline() const {
  const Impl& im = *impl_;
  if (im.step_seconds.empty())
    throw UserError("[timeline] profiling is off: compile with CompileOptions::profile or set PX_PROFILE=1");
  if (im.profiled_runs == 0) throw UserError("[timeline] no run profiled yet: run the executable first");
  Timeline t;
  std::vector<int> started(im.colls.size(), -1);
  for (size_t u = 0; u < im.units.size(); ++u) {
    if (im.unit_begin[u] < 0) continue;  // views run nothing
    const int c = im.coll_of_unit[u];
    const int64_t bytes = c >= 0 ? numel(im.colls[c].in_shape) * dtype_size(im.colls[c].dtype) : 0;
    t.device.push_back({im.units[u].label, im.unit_begin[u], im.unit_end[u], bytes});
    t.run_s = std::max(t.run_s, im.unit_end[u]);
    if (c < 0) continue;
    t.exposed_s += im.unit_end[u] - im.unit_begin[u];
    if (im.units[u].kind == Unit::Kind::collective_start) {
      started[c] = static_cast<int>(u);
    } else if (started[c] >= 0) {
      t.in_flight.push_back({im.colls[c].name(), im.unit_begin[started[c]], im.unit_end[u], bytes});
      t.in_flight_s += im.unit_end[u] - im.unit_begin[started[c]];
    }
  }
  return t;
}

std::string Timeline::chrome_trace() const {
  // Names are kernel labels and collective kinds: letters, digits, braces, commas and dots.
  std::ostringstream os;
  os << "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"run_s\": " << run_s << ", \"in_flight_s\": " << in_flight_s
     << ", \"exposed_s\": " << exposed_s << ", \"overlap\": " << overlap() << "}, \"traceEvents\": [\n";
  os << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {\"name\": \"device\"}},\n";
  os << "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 0, \"tid\": 1, \"args\": {\"name\": \"in flight\"}}";
  for (int track = 0; track < 2; ++track)
    for (const Span& s : track == 0 ? device : in_flight) {
      os << ",\n{\"name\": \"";
      for (char ch : s.name) os << (ch == '"' || ch == '\\' ? '_' : ch);
      os << "\", \"ph\": \"X\", \"pid\": 0, \"tid\": " << track << ", \"ts\": " << s.begin_s * 1e6
         << ", \"dur\": " << (s.end_s - s.begin_s) * 1e6;
      if (s.bytes > 0) os << ", \"args\": {\"bytes\": " << s.bytes << "}";
      os << "}";
    }
  os << "\n]}\n";
  return os.str();
}

std::string Executable::summary() const {
  const Impl& im = *impl_;
  std::ostringstream os;
  os << "executable: " << num_steps() << " kernels, " << im.colls.size() << " collectives, " << im.fused_groups
     << " fused groups, on " << im.devices.size() << " device(s); arena " << im.plan.peak_bytes
     << " bytes per device (+" << im.output_bytes << " bytes of outputs)\n";
  for (size_t s = 0; s < im.units.size(); ++s) {
    const Unit& u = im.units[s];
    if (u.kind == Unit::Kind::view) continue;
    os << "  " << s << ": " << u.label << " ->";
    for (int v : u.out_values) {
      os << " %" << v;
      if (im.plan.offset[v] >= 0)
        os << "@" << im.plan.offset[v];
      else if (im.host_plan.offset[v] >= 0)
        os << "@host:" << im.host_plan.offset[v];
      else
        os << "@out";
    }
    if (u.kind == Unit::Kind::collective_wait)
      for (int v : u.in_values) os << " %" << v;
    os << "\n";
  }
  return os.str();
}

}  // namespace px
