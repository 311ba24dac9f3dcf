// Executable: the schedule (runtime/schedule.h), one buffer plan for the whole program
// (runtime/plan.h), and a run loop that only calls prepared kernels and collectives on
// precomputed pointers. One program runs on one or several devices of this process in lockstep:
// each device has its own arena and kernel instances, the schedule and plan are shared. The
// devices are the communicator's local participants (every mesh position in one process, or one
// process's positions of a mesh that spans several); collectives pass one buffer per local device.
#include "parallax/runtime.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <fstream>
#include <map>
#include <sstream>

#include "backend/backend.h"
#include "core/dump.h"
#include "core/env.h"
#include "core/exclusive.h"
#include "core/log.h"
#include "ir/primitive.h"
#include "parallax/passes.h"
#include "runtime/order.h"
#include "runtime/plan.h"
#include "runtime/program.h"
#include "runtime/schedule.h"

namespace px {

const char* memory_category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::params:
      return "params";
    case MemoryCategory::gradients:
      return "gradients";
    case MemoryCategory::optimizer_state:
      return "optimizer_state";
    case MemoryCategory::activations:
      return "activations";
    case MemoryCategory::temporaries:
      return "temporaries";
    case MemoryCategory::collective_buffers:
      return "collective_buffers";
  }
  return "?";
}

std::string MemoryReport::to_string() const {
  std::ostringstream os;
  os << "peak " << peak_bytes << " bytes per device (inputs " << input_bytes << ", outputs " << output_bytes
     << ", arena " << arena_bytes << " of which " << arena_live_bytes << " live at the peak)\n";
  if (floor_bytes > 0)
    os << "floor " << floor_bytes << " bytes (the caller's arrays and what must be alive together in any order); "
       << "peak / floor " << peak_over_floor() << "\n";
  if (donated_bytes > 0) os << "donated: " << donated_bytes << " bytes of outputs written into their inputs\n";
  for (int c = 0; c < kNumMemoryCategories; ++c)
    os << "  " << memory_category_name(static_cast<MemoryCategory>(c)) << ": " << by_category[c]
       << " bytes at the peak (arena at most " << arena_max_by_category[c] << " at once)\n";
  if (host_peak_bytes() > 0 || transfer_bytes > 0)
    os << "pinned_host " << host_peak_bytes() << " bytes (inputs " << host_input_bytes << ", outputs "
       << host_output_bytes << ", arena " << host_arena_bytes << "); " << transfer_bytes
       << " bytes transferred between memory kinds per run\n";
  bool layers = false;
  for (const Use& u : largest) layers = layers || !u.layer.empty();
  if (layers) {
    os << "largest at the peak, by category and layer:\n";
    for (size_t i = 0; i < largest.size() && i < 8; ++i)
      os << "  " << memory_category_name(largest[i].category) << " "
         << (largest[i].layer.empty() ? std::string("(no layer)") : largest[i].layer) << ": " << largest[i].bytes
         << " bytes\n";
  }
  return os.str();
}

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
  // Buffers of the plan: ids [0, values) are values (by root), then collective packing scratch.
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
    std::byte* host_arena = nullptr;
    std::vector<Step> steps;
    std::vector<std::byte*> spill;  // per home, allocated on the first run that needs it
    std::vector<char> spilled;      // per home, this run
    std::vector<Range> ranges;      // run-time scratch, reserved at compile time
  };
  std::vector<Device> devices;
  Communicator* comm = nullptr;
  Backend* backend = &cpu_backend();
  bool over_devices = false;
  int threads = 1;
  std::vector<CollectiveHandle> handles;  // per collective, between its start and its wait
  std::vector<double> step_seconds;       // per unit, summed over runs; empty unless profiling
  int profiled_runs = 0;
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
      backend->free({d.id}, d.arena, plan.peak_bytes);
      backend->free({d.id, MemoryKind::pinned_host}, d.host_arena, host_plan.peak_bytes);
      for (size_t h = 0; h < d.spill.size(); ++h)
        backend->free({d.id, output_kind[homes[h].pos]}, d.spill[h], homes[h].nbytes);
    }
  }
  // Copies still in flight write into the arenas: wait for them (a collective left pending by a
  // failed run is not waited: its peers may be gone).
  void wait_pending() {
    for (size_t c = 0; c < handles.size() && c < colls.size(); ++c) {
      if (colls[c].kind != "transfer" || !handles[c].pending()) continue;
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
// compile_on_devices and plan_program, so that a planned program is exactly what would run.
std::unique_ptr<Executable::Impl> plan_impl(const Graph& src, const CompileOptions& opt,
                                            const std::function<CollectiveGroups(const Node&)>& groups) {
  using Impl = Executable::Impl;
  auto impl = std::make_unique<Impl>();
  src.verify();
  // Autocast, then CSE and DCE; value categories follow the values through both.
  std::unique_ptr<Graph> prepared;
  std::vector<int> to_prepared;  // per value of src, its id in prepared (-1: dropped)
  if (opt.compute_dtype != DType::f32) {
    std::vector<int> cast_map, narrow_map;
    prepared = narrow_gathers(*autocast(src, opt.compute_dtype, &cast_map), &narrow_map);
    to_prepared.assign(src.values().size(), -1);
    for (size_t v = 0; v < cast_map.size(); ++v)
      if (cast_map[v] >= 0) to_prepared[v] = narrow_map[cast_map[v]];
    dump_pass("autocast", [&] { return prepared->to_string(); });
  }
  const Graph& in_graph = prepared ? *prepared : src;
  std::vector<int> to_cse, to_dce;
  if (opt.optimize) {
    auto c = cse(in_graph, &to_cse);
    impl->graph = dce(*c, &to_dce);
  } else {
    impl->graph = in_graph.clone();
  }
  const Graph& g = *impl->graph;
  const auto& nodes = g.nodes();
  const size_t nv = g.values().size();
  // Per value of src, its value in g (-1: dropped).
  auto final_of = [&](size_t v) {
    int p = prepared ? to_prepared[v] : static_cast<int>(v);
    if (p < 0) return -1;
    return opt.optimize ? (to_cse[p] >= 0 ? to_dce[to_cse[p]] : -1) : p;
  };
  for (size_t given : {opt.value_categories.size(), opt.value_kinds.size(), opt.value_layers.size()})
    if (given && given != src.values().size())
      throw Error("[compile] value_categories, value_kinds and value_layers need one entry per value of the graph (" +
                  std::to_string(src.values().size()) + "), got " + std::to_string(given));
  // Memory kinds: as given, else a transfer's target, else host when every operand is on the host.
  std::vector<signed char> given_kind(nv, -1);
  for (size_t v = 0; v < opt.value_kinds.size(); ++v)
    if (int w = final_of(v); w >= 0) given_kind[w] = static_cast<signed char>(opt.value_kinds[v]);
  impl->buffer_kind.assign(nv, MemoryKind::device);
  std::vector<MemoryKind>& kind = impl->buffer_kind;
  for (int v : g.inputs())
    if (given_kind[v] >= 0) kind[v] = static_cast<MemoryKind>(given_kind[v]);
  for (const Node& n : nodes) {
    MemoryKind k = MemoryKind::device;
    if (n.prim->name == "transfer") {
      k = parse_memory_kind(n.attrs.s("to"));
    } else if (!n.inputs.empty()) {
      bool host = true;
      for (int v : n.inputs) host = host && kind[v] == MemoryKind::pinned_host;
      if (host) k = MemoryKind::pinned_host;
    }
    for (int v : n.outputs)
      kind[v] = n.prim->name != "transfer" && given_kind[v] >= 0 ? static_cast<MemoryKind>(given_kind[v]) : k;
  }
  for (int v : g.inputs()) impl->input_kind.push_back(kind[v]);
  for (int v : g.outputs()) impl->output_kind.push_back(kind[v]);
  std::vector<MemoryCategory> category(nv, MemoryCategory::temporaries);
  if (!opt.value_categories.empty()) {
    for (size_t v = 0; v < src.values().size(); ++v)
      if (int w = final_of(v); w >= 0) category[w] = opt.value_categories[v];
  } else {
    for (int v : g.inputs()) category[v] = MemoryCategory::activations;
  }
  for (int v : g.outputs())
    if (opt.value_categories.empty()) category[v] = MemoryCategory::activations;
  std::vector<std::string> layer(nv);
  for (size_t v = 0; v < opt.value_layers.size(); ++v)
    if (int w = final_of(v); w >= 0) layer[w] = opt.value_layers[v];

  // Update as gradients complete: the same values, the nodes that depend on a gradient moved up.
  if (opt.update_as_gradients_complete)
    if (std::unique_ptr<Graph> early = update_as_gradients_complete(g, category)) *impl->graph = std::move(*early);
  if (opt.optimize) dump_pass("optimize", [&] { return g.to_string(); });
  ScheduleOptions so;
  so.backend = impl->backend;
  so.fuse_elementwise = opt.fuse_elementwise;
  so.collective_lookahead = opt.collective_lookahead;
  so.prefetch_depth = opt.prefetch_depth;
  impl->units = make_schedule(g, so);
  dump_pass("schedule", [&] {
    std::ostringstream os;
    for (size_t u = 0; u < impl->units.size(); ++u) {
      const Unit& unit = impl->units[u];
      os << u << ": " << unit.label << " (";
      for (size_t k = 0; k < unit.in_values.size(); ++k) os << (k ? ", " : "") << "%" << unit.in_values[k];
      os << ") ->";
      for (int v : unit.out_values) os << " %" << v;
      os << "\n";
    }
    return os.str();
  });
  std::vector<char> is_output(nv, 0);
  for (int v : g.outputs()) is_output[v] = 1;

  // Reshapes outside fused groups are views: their result shares the operand's storage.
  impl->root.resize(nv);
  for (size_t v = 0; v < nv; ++v) impl->root[v] = static_cast<int>(v);
  for (const Unit& u : impl->units)
    if (u.kind == Unit::Kind::view) impl->root[u.out_values[0]] = impl->root[u.in_values[0]];
  const std::vector<int>& root = impl->root;

  // Collectives: ops, scratch buffers (after the value buffers), blocks.
  impl->buffer_bytes.assign(nv, 0);
  for (size_t v = 0; v < nv; ++v) impl->buffer_bytes[v] = g.type(static_cast<int>(v)).nbytes();
  impl->buffer_category = category;
  impl->coll_of_unit.assign(impl->units.size(), -1);
  std::map<int, int> coll_of_node;
  std::vector<std::vector<int>>& scratch_of = impl->scratch_of;
  for (size_t u = 0; u < impl->units.size(); ++u) {
    const Unit& unit = impl->units[u];
    if (unit.kind != Unit::Kind::collective_start && unit.kind != Unit::Kind::collective_wait) continue;
    int node = unit.nodes[0];
    auto it = coll_of_node.find(node);
    if (it == coll_of_node.end() && nodes[node].prim->name == "transfer") {
      // A copy between memory kinds, run by the backend's copy stream; its result is categorized
      // as what it copies.
      CollectiveOp c;
      c.kind = "transfer";
      c.dtype = g.type(nodes[node].inputs[0]).dtype;
      c.in_shape = c.out_shape = g.type(nodes[node].inputs[0]).shape;
      impl->colls.push_back(std::move(c));
      it = coll_of_node.emplace(node, static_cast<int>(impl->colls.size()) - 1).first;
      scratch_of.emplace_back();
      int in = nodes[node].inputs[0], out = nodes[node].outputs[0];
      if (category[out] == MemoryCategory::temporaries) impl->buffer_category[out] = category[in];
      impl->report.transfer_bytes += g.type(in).nbytes();
    } else if (it == coll_of_node.end()) {
      if (!groups)
        throw Error("[compile] the program has the collective '" + nodes[node].prim->name + "' (%" +
                    std::to_string(nodes[node].outputs[0]) +
                    "): compile it for a mesh with px::ShardedExecutable, not px::Executable");
      impl->colls.push_back(make_collective_op(g, nodes[node], groups(nodes[node])));
      it = coll_of_node.emplace(node, static_cast<int>(impl->colls.size()) - 1).first;
      const CollectiveOp& c = impl->colls.back();
      std::vector<int> scratch;
      for (int64_t elems : {c.scratch_in, c.scratch_out}) {
        if (!elems) continue;
        scratch.push_back(static_cast<int>(impl->buffer_bytes.size()));
        impl->buffer_bytes.push_back(elems * dtype_size(c.dtype));
        impl->buffer_category.push_back(MemoryCategory::collective_buffers);
        impl->buffer_kind.push_back(MemoryKind::device);
      }
      scratch_of.push_back(scratch);
      for (int v : nodes[node].outputs)
        if (category[v] == MemoryCategory::temporaries) impl->buffer_category[v] = MemoryCategory::collective_buffers;
    }
    impl->coll_of_unit[u] = it->second;
  }
  impl->handles.resize(impl->colls.size());
  for (size_t u = 0; u < impl->units.size();) {
    if (impl->coll_of_unit[u] >= 0) {
      impl->blocks.push_back({static_cast<int>(u), static_cast<int>(u) + 1, true});
      ++u;
      continue;
    }
    size_t e = u;
    while (e < impl->units.size() && impl->coll_of_unit[e] < 0) ++e;
    impl->blocks.push_back({static_cast<int>(u), static_cast<int>(e), false});
    u = e;
  }

  // Donation: output o written into input donor[o]'s array. In place when the input's last reader
  // runs before the unit that writes the output (or is that unit, when it may alias); else the
  // output is computed into the arena and copied into the array at the end.
  impl->output_donor.assign(g.outputs().size(), -1);
  std::vector<char> copy_at_end(g.outputs().size(), 0);
  if (!opt.output_donors.empty()) {
    if (opt.output_donors.size() != g.outputs().size())
      throw Error("[compile] output_donors needs one entry per output (" + std::to_string(g.outputs().size()) +
                  "), got " + std::to_string(opt.output_donors.size()));
    std::vector<int> writer(nv, -1), last_read(nv, -1);
    for (size_t u = 0; u < impl->units.size(); ++u) {
      if (impl->units[u].kind == Unit::Kind::view) continue;  // reads nothing: its readers read the root
      for (int v : impl->units[u].in_values) last_read[root[v]] = static_cast<int>(u);
      for (int v : impl->units[u].out_values)
        if (writer[v] < 0) writer[v] = static_cast<int>(u);
    }
    std::vector<char> returned(nv, 0), taken(g.inputs().size(), 0);
    for (int v : g.outputs()) returned[root[v]] = 1;
    for (size_t o = 0; o < g.outputs().size(); ++o) {
      const int i = opt.output_donors[o];
      if (i < 0) continue;
      const int v = g.outputs()[o];
      if (i >= static_cast<int>(g.inputs().size()) || taken[i])
        throw Error("[compile] output_donors[" + std::to_string(o) + "] = " + std::to_string(i) +
                    ": not an input, or an input donated to two outputs");
      const int in = g.inputs()[i];
      if (g.type(in) != g.type(v) || kind[in] != kind[v])
        throw Error("[compile] output " + std::to_string(o) + " (" + type_str(g.type(v)) + " in " +
                    memory_kind_name(kind[v]) + " memory) cannot be written into input " + std::to_string(i) + " (" +
                    type_str(g.type(in)) + " in " + memory_kind_name(kind[in]) + " memory)");
      taken[i] = 1;
      impl->output_donor[o] = i;
      if (g.values()[v].producer < 0) continue;  // an input returned: copied at the end
      const int w = writer[v], last = last_read[in];
      const bool in_place = !returned[in] && (last < w || (last == w && w >= 0 && impl->units[w].alias_safe));
      copy_at_end[o] = !in_place;
    }
  }

  // Returned values: the first position of each computed value is its home.
  std::vector<int> home_of(nv, -1);
  impl->output_values = g.outputs();
  impl->home_at_pos.assign(g.outputs().size(), -1);
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    impl->output_bytes += g.type(v).nbytes();
    if (copy_at_end[o]) {
      impl->copies_at_end.push_back({v, static_cast<int>(o)});
      continue;
    }
    if (g.values()[v].producer < 0 || home_of[v] >= 0) continue;
    home_of[v] = static_cast<int>(impl->homes.size());
    impl->home_at_pos[o] = home_of[v];
    impl->homes.push_back({v, static_cast<int>(o), -1, g.type(v).nbytes(), {}});
  }
  for (int v : g.inputs()) impl->input_bytes += g.type(v).nbytes();

  // Buffer plan over the units, on storage roots; inputs and homes live in caller memory. A
  // collective's operand and result are live from its start to its wait, its scratch too.
  std::vector<char> external(impl->buffer_bytes.size(), 0);
  for (int v : g.inputs()) external[v] = 1;
  for (const Impl::Home& h : impl->homes) external[h.value] = 1;
  std::vector<PlanStep> pst;
  for (size_t u = 0; u < impl->units.size(); ++u) {
    const Unit& unit = impl->units[u];
    PlanStep ps;
    for (int v : unit.in_values) ps.in.push_back(root[v]);
    if (unit.kind != Unit::Kind::view) ps.out = unit.out_values;
    int c = impl->coll_of_unit[u];
    if (c >= 0) {
      auto& sc = scratch_of[c];
      (unit.kind == Unit::Kind::collective_start ? ps.out : ps.in)
          .insert(unit.kind == Unit::Kind::collective_start ? ps.out.end() : ps.in.end(), sc.begin(), sc.end());
    }
    pst.push_back(std::move(ps));
  }
  std::vector<int> live_to_end;
  for (int v : g.outputs()) live_to_end.push_back(root[v]);
  // One arena per memory kind: each plan sees the other kind's buffers as external.
  const std::vector<MemoryKind>& bkind = impl->buffer_kind;
  bool any_host = false;
  std::vector<char> ext_device = external, ext_host = external;
  for (size_t b = 0; b < bkind.size(); ++b) {
    const bool host = bkind[b < nv ? root[b] : b] == MemoryKind::pinned_host;
    (host ? ext_device : ext_host)[b] = 1;
    any_host = any_host || (host && !external[b]);
  }
  impl->plan = plan_buffers(impl->buffer_bytes, pst, ext_device, live_to_end);
  if (any_host)
    impl->host_plan = plan_buffers(impl->buffer_bytes, pst, ext_host, live_to_end);
  else
    impl->host_plan.offset.assign(impl->buffer_bytes.size(), -1);

  // The memory report: caller arrays by their category, and the arena's buffers live at the peak.
  MemoryReport& rep = impl->report;
  for (int v : g.inputs())
    (kind[v] == MemoryKind::device ? rep.input_bytes : rep.host_input_bytes) += g.type(v).nbytes();
  auto counted_output = [&](size_t o) { return impl->output_donor[o] < 0; };  // a donated one: with its input
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const int v = g.outputs()[o];
    if (!counted_output(o))
      rep.donated_bytes += g.type(v).nbytes();
    else
      (kind[v] == MemoryKind::device ? rep.output_bytes : rep.host_output_bytes) += g.type(v).nbytes();
  }
  rep.arena_bytes = impl->plan.peak_bytes;
  rep.host_arena_bytes = impl->host_plan.peak_bytes;
  rep.arena_live_bytes = impl->plan.peak_live_bytes;
  rep.peak_bytes = rep.input_bytes + rep.output_bytes + rep.arena_bytes;
  for (int v : g.inputs())
    if (kind[v] == MemoryKind::device) rep.by_category[static_cast<int>(category[v])] += g.type(v).nbytes();
  for (size_t o = 0; o < g.outputs().size(); ++o)
    if (const int v = g.outputs()[o]; kind[v] == MemoryKind::device && counted_output(o))
      rep.by_category[static_cast<int>(category[v])] += g.type(v).nbytes();
  for (int b : impl->plan.live_at_peak)
    rep.by_category[static_cast<int>(impl->buffer_category[b])] += aligned_size(impl->buffer_bytes[b]);
  {
    // The same bytes by category and layer (collective scratch has no layer).
    std::map<std::pair<int, std::string>, int64_t> use;
    for (int v : g.inputs())
      if (kind[v] == MemoryKind::device) use[{static_cast<int>(category[v]), layer[v]}] += g.type(v).nbytes();
    for (size_t o = 0; o < g.outputs().size(); ++o)
      if (const int v = g.outputs()[o]; kind[v] == MemoryKind::device && counted_output(o))
        use[{static_cast<int>(category[v]), layer[v]}] += g.type(v).nbytes();
    for (int b : impl->plan.live_at_peak)
      use[{static_cast<int>(impl->buffer_category[b]), b < static_cast<int>(nv) ? layer[b] : std::string()}] +=
          aligned_size(impl->buffer_bytes[b]);
    for (auto& [key, bytes] : use) rep.largest.push_back({static_cast<MemoryCategory>(key.first), key.second, bytes});
    std::stable_sort(rep.largest.begin(), rep.largest.end(),
                     [](const MemoryReport::Use& a, const MemoryReport::Use& b) { return a.bytes > b.bytes; });
  }
  {
    // Sweep the buffers' lifetimes for the most bytes of each category live at once.
    std::vector<std::array<int64_t, kNumMemoryCategories>> delta(impl->units.size() + 1);
    for (size_t b = 0; b < impl->buffer_bytes.size(); ++b) {
      if (impl->plan.offset[b] < 0) continue;
      int c = static_cast<int>(impl->buffer_category[b]);
      delta[impl->plan.first_step[b]][c] += aligned_size(impl->buffer_bytes[b]);
      delta[impl->plan.last_step[b] + 1][c] -= aligned_size(impl->buffer_bytes[b]);
    }
    std::array<int64_t, kNumMemoryCategories> cur{};
    for (const auto& d : delta)
      for (int c = 0; c < kNumMemoryCategories; ++c) {
        cur[c] += d[c];
        rep.arena_max_by_category[c] = std::max(rep.arena_max_by_category[c], cur[c]);
      }
  }

  {
    // The floor: the caller's arrays and the arena bytes that must be alive together in any order.
    // A training step's backward pass and update run after its forward pass (what remat saves is
    // alive across), whatever else the dependences would allow.
    // Copies and collectives are bound by their operands only.
    std::vector<char> phase;
    if (const std::vector<char> fwd = forward_nodes(g, category); !fwd.empty()) {
      phase.assign(impl->units.size(), 0);
      for (size_t u = 0; u < impl->units.size(); ++u) {
        const Unit& unit = impl->units[u];
        if (impl->coll_of_unit[u] >= 0) {
          phase[u] = 2;
          continue;
        }
        for (int node : unit.nodes) phase[u] = phase[u] || !fwd[node];
      }
    }
    auto [must, unit] = must_live_bytes(impl->buffer_bytes, pst, ext_device, live_to_end, phase);
    if (must < 0) must = impl->plan.peak_live_bytes;  // too many units to analyse: what the plan holds
    rep.floor_bytes = rep.input_bytes + rep.output_bytes + must;
    rep.floor_live_unit = unit;
  }

  if (opt.host_memory_limit_bytes > 0 && rep.host_peak_bytes() > opt.host_memory_limit_bytes)
    throw UserError("[compile] the program needs " + std::to_string(rep.host_peak_bytes()) +
                    " bytes of pinned_host memory per device, over the limit of " +
                    std::to_string(opt.host_memory_limit_bytes) + " bytes:\n" + rep.to_string() +
                    "Offload less (OffloadOptions), raise the limit, or shard the program over more devices.");
  if (opt.memory_limit_bytes > 0 && rep.peak_bytes > opt.memory_limit_bytes) {
    std::ostringstream os;
    os << "[compile] the program needs " << rep.peak_bytes << " bytes per device, over the limit of "
       << opt.memory_limit_bytes << " bytes:\n"
       << rep.to_string() << "Largest buffers live at the peak:\n";
    std::vector<int> big = impl->plan.live_at_peak;
    std::sort(big.begin(), big.end(), [&](int a, int b) { return impl->buffer_bytes[a] > impl->buffer_bytes[b]; });
    for (size_t i = 0; i < big.size() && i < 8; ++i) {
      int b = big[i];
      if (b < static_cast<int>(nv)) {
        int p = g.values()[b].producer;
        os << "  %" << b << " " << type_str(g.type(b)) << " " << impl->buffer_bytes[b] << " bytes from "
           << (p >= 0 ? nodes[p].prim->name : std::string("input"))
           << (layer[b].empty() ? std::string() : " in " + layer[b]) << "\n";
      } else {
        os << "  collective scratch " << impl->buffer_bytes[b] << " bytes\n";
      }
    }
    std::vector<int> outs = g.outputs();
    std::sort(outs.begin(), outs.end(), [&](int a, int b) { return g.type(a).nbytes() > g.type(b).nbytes(); });
    for (size_t i = 0; i < outs.size() && i < 5; ++i) {
      size_t pos = std::find(g.outputs().begin(), g.outputs().end(), outs[i]) - g.outputs().begin();
      os << "  output " << pos << ": %" << outs[i] << " " << type_str(g.type(outs[i])) << " "
         << g.type(outs[i]).nbytes() << " bytes\n";
    }
    os << "Raise the limit, shrink the batch, rematerialize activations (TrainStepOptions::remat) or shard the "
          "program over more devices.";
    throw UserError(os.str());
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

std::unique_ptr<Executable> compile_on_devices(const Graph& src, const CompileOptions& opt, const DeviceSetup& setup) {
  using Impl = Executable::Impl;
  apply_thread_settings();
  if (setup.device_ids.empty()) throw Error("[compile] internal: no devices to compile for");
  // Devices with a capacity limit what the plan may use.
  CompileOptions limited = opt;
  for (int id : setup.device_ids)
    for (auto [kind, limit] : {std::pair{MemoryKind::device, &limited.memory_limit_bytes},
                               std::pair{MemoryKind::pinned_host, &limited.host_memory_limit_bytes}}) {
      const int64_t cap = memory_capacity({id, kind});
      if (cap > 0 && (*limit == 0 || cap < *limit)) *limit = cap;
    }
  std::unique_ptr<Impl> impl = plan_impl(src, limited, setup.groups);
  bool has_collectives = false;
  for (const CollectiveOp& c : impl->colls) has_collectives = has_collectives || c.kind != "transfer";
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
    for (size_t k = 0; k < outs.size(); ++k) {
      int v = outs[k];
      if (v < static_cast<int>(nv) && home_of[v] >= 0) {
        impl->homes[home_of[v]].refs.push_back({si, static_cast<int>(k), true});
        if (impl->homes[home_of[v]].producer_step < 0) impl->homes[home_of[v]].producer_step = si;
      }
      out_off[s].push_back(offset_of(v));
    }
  }

  // Kernels and arenas per device. Kernels hold per-thread scratch, so devices that run at the
  // same time need their own instances; devices run one after the other share them.
  if (setup.comm && setup.comm->local_positions().size() != setup.device_ids.size())
    throw Error("[compile] internal: " + std::to_string(setup.device_ids.size()) +
                " devices but the communicator has " + std::to_string(setup.comm->local_positions().size()) +
                " local participants");
  impl->comm = setup.comm;
  impl->threads = impl->backend->num_threads();
  impl->over_devices = setup.over_devices && setup.device_ids.size() > 1;
  for (size_t d = 0; d < setup.device_ids.size(); ++d) {
    // Held by impl from the start: its destructor frees the arena if a kernel lookup below throws.
    impl->devices.emplace_back();
    Impl::Device& dev = impl->devices.back();
    dev.id = setup.device_ids[d];
    dev.arena = static_cast<std::byte*>(impl->backend->allocate({dev.id}, impl->plan.peak_bytes));
    if (impl->host_plan.peak_bytes > 0)
      dev.host_arena = static_cast<std::byte*>(
          impl->backend->allocate({dev.id, MemoryKind::pinned_host}, impl->host_plan.peak_bytes));
    dev.spill.assign(impl->homes.size(), nullptr);
    dev.spilled.assign(impl->homes.size(), 0);
    dev.ranges.reserve(g.inputs().size() + g.outputs().size());
    for (size_t s = 0; s < impl->units.size(); ++s) {
      const Unit& unit = impl->units[s];
      Step st;
      if (d > 0 && !impl->over_devices) {
        st.kernel = impl->devices[0].steps[s].kernel;
      } else if (unit.kind == Unit::Kind::fused || unit.kind == Unit::Kind::kernel) {
        st.kernel = impl->backend->make_kernel(g, unit);
      }
      auto ptr = [&](int64_t off) -> std::byte* {
        return off >= 0 ? dev.arena + off : off <= -2 ? dev.host_arena + (-2 - off) : nullptr;
      };
      for (int64_t off : in_off[s]) st.in_ptrs.push_back(ptr(off));
      for (int64_t off : out_off[s]) st.out_ptrs.push_back(ptr(off));
      dev.steps.push_back(std::move(st));
    }
  }
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
    if (inputs[i].placement().kind != input_kind[i])
      throw Error("[run] input " + std::to_string(i) + name() + " is in " +
                  memory_kind_name(inputs[i].placement().kind) + " memory but the program reads it from " +
                  memory_kind_name(input_kind[i]) +
                  " memory (Executable::input_kind): copy it there, e.g. "
                  "px::Array(dtype, shape, {device, px::MemoryKind::" +
                  memory_kind_name(input_kind[i]) + "})");
  }
  if (outputs.size() != output_values.size())
    throw Error("[run] expected " + std::to_string(output_values.size()) + " output arrays, got " +
                std::to_string(outputs.size()));
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = output_values[o];
    if (outputs[o].type() != g.type(v) || !outputs[o].defined())
      throw Error("[run] output array " + std::to_string(o) + " has type " + type_str(outputs[o].type()) +
                  (outputs[o].defined() ? "" : " and no data") + ", expected " + type_str(g.type(v)));
    if (outputs[o].placement().kind != output_kind[o])
      throw Error("[run] output array " + std::to_string(o) + " is in " +
                  memory_kind_name(outputs[o].placement().kind) + " memory but the program writes it to " +
                  memory_kind_name(output_kind[o]) + " memory (Executable::output_kind)");
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
        dev.spill[h] = static_cast<std::byte*>(backend->allocate({dev.id, output_kind[homes[h].pos]}, homes[h].nbytes));
      dst = dev.spill[h];
    }
    patch(homes[h].refs, dst);
  }
}

// Copies what the steps did not write in place: inputs returned as outputs, spilled homes, and
// values returned at several positions.
void Executable::Impl::finish(const std::vector<Array>& inputs, std::vector<Array>& outputs, Device& dev) {
  const Graph& g = *graph;
  // Inputs returned as outputs are copied first (a spilled home may overwrite that input next).
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = root[output_values[o]];
    if (g.values()[v].producer >= 0 || outputs[o].nbytes() == 0) continue;
    const void* src = inputs[g.values()[v].output_index].raw();
    if (src != outputs[o].raw()) std::memmove(outputs[o].raw(), src, static_cast<size_t>(outputs[o].nbytes()));
  }
  for (const CopyAtEnd& c : copies_at_end) {
    const int b = root[c.value];
    if (plan.offset[b] < 0 && host_plan.offset[b] < 0) continue;  // also returned at a home: copied below
    const std::byte* src = plan.offset[b] >= 0 ? dev.arena + plan.offset[b] : dev.host_arena + host_plan.offset[b];
    if (outputs[c.pos].nbytes()) std::memcpy(outputs[c.pos].raw(), src, static_cast<size_t>(outputs[c.pos].nbytes()));
  }
  for (size_t h = 0; h < homes.size(); ++h)
    if (dev.spilled[h] && homes[h].nbytes)
      std::memcpy(outputs[homes[h].pos].raw(), dev.spill[h], static_cast<size_t>(homes[h].nbytes));
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = output_values[o];
    if (g.values()[v].producer < 0 || home_at_pos[o] >= 0 || outputs[o].nbytes() == 0) continue;
    for (const Home& h : homes)
      if (h.value == v && outputs[h.pos].raw() != outputs[o].raw())
        std::memmove(outputs[o].raw(), outputs[h.pos].raw(), static_cast<size_t>(outputs[o].nbytes()));
  }
}

void Executable::Impl::run_collective(int u) {
  const int c = coll_of_unit[u];
  if (units[u].kind == Unit::Kind::collective_wait) {
    handles[c].wait();
    return;
  }
  const size_t D = devices.size();
  if (colls[c].kind == "transfer") {
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
  handles[c] = start_collective(*comm, op, ins, outs, s_in, s_out);
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
    // Devices share the cores; kernels called inside the region run on their calling thread.
    std::exception_ptr failure;
    const int64_t D = static_cast<int64_t>(devices.size());
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t d = 0; d < D; ++d) {
      try {
        run_units(devices[d], begin, end);
      } catch (...) {
#pragma omp critical(px_device_run)
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
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
  // Inputs in another memory kind (e.g. params a training step keeps offloaded) are copied to the
  // kind the program reads, for this call.
  std::vector<Array> inputs = in;
  for (size_t i = 0; i < inputs.size() && i < impl_->input_kind.size(); ++i)
    if (inputs[i].defined() && inputs[i].placement().kind != impl_->input_kind[i])
      inputs[i] = inputs[i].to({inputs[i].placement().device, impl_->input_kind[i]});
  // A donated input's array takes its output (CompileOptions::output_donors).
  std::vector<Array> outs;
  for (int v : impl_->output_values) {
    const int donor = impl_->output_donor[outs.size()];
    if (donor >= 0 && donor < static_cast<int>(inputs.size()) && inputs[donor].defined() &&
        inputs[donor].placement().kind == impl_->output_kind[outs.size()] &&
        inputs[donor].type() == impl_->graph->type(v))
      outs.push_back(inputs[donor]);
    else
      outs.emplace_back(impl_->graph->type(v).dtype, impl_->graph->type(v).shape,
                        Placement{impl_->devices[0].id, impl_->output_kind[outs.size()]});
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
  if (!im.step_seconds.empty()) ++im.profiled_runs;
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
  if (!im.step_seconds.empty()) ++im.profiled_runs;
  for (size_t d = 0; d < im.devices.size(); ++d) im.finish(inputs[d], outputs[d], im.devices[d]);
}

int64_t Executable::peak_bytes() const { return impl_->plan.peak_bytes; }
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
    e.first += im.step_seconds[s] / im.profiled_runs;
    e.second += 1;
    total += im.step_seconds[s] / im.profiled_runs;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_label.begin(), by_label.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  std::ostringstream os;
  os << "profile: " << im.profiled_runs << " runs, " << total * 1e3 << " ms per run in kernels and collectives\n";
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
      const std::string& kind = im.colls[c].kind;
      t.in_flight.push_back({kind, im.unit_begin[started[c]], im.unit_end[u], bytes});
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
