// Executable: topological schedule, elementwise fusion, liveness-based buffer plan, and a run
// loop that only calls prepared kernels on precomputed pointers.
#include "parallax/runtime.h"

#include <algorithm>
#include <chrono>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "backend/cpu/kernel.h"
#include "core/env.h"
#include "core/log.h"
#include "ir/primitive.h"
#include "parallax/passes.h"
#include "runtime/plan.h"

namespace px {

namespace {

struct Step {
  cpu::Kernel kernel;
  std::string label;
  std::vector<int> in_values, out_values;
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  bool alias_safe = false;  // a result may share its array with an operand (tile-wise kernels)
};

bool is_broadcast(const Node& n) { return n.prim->name == "broadcast_in_dim" && n.outputs.size() == 1; }
bool is_reshape(const Node& n) { return n.prim->name == "reshape" && n.inputs.size() == 1 && n.outputs.size() == 1; }

bool fusible(const Graph& g, const Node& n) {
  if (!n.prim->elementwise || n.outputs.size() != 1) return false;
  const cpu::EltwiseKernel* ek = cpu::find_eltwise(n.prim->name);
  if (!ek || !ek->f32) return false;
  // Integer-only nodes take the exact i32 path, which is not fused.
  auto int_like = [](DType d) { return d == DType::i32 || d == DType::boolean; };
  bool all_int = int_like(g.type(n.outputs[0]).dtype);
  for (int v : n.inputs) all_int = all_int && int_like(g.type(v).dtype);
  return !(all_int && ek->i32);
}

void dump(const Executable& exe, const std::string& dir) {
  static std::atomic<int> counter{0};
  std::string path = dir + "/executable_" + std::to_string(counter++) + ".txt";
  std::ofstream f(path);
  if (!f) {
    PX_LOG(warn) << "PX_DUMP_DIR: cannot write " << path;
    return;
  }
  f << exe.graph().to_string() << "\n" << exe.summary();
}

}  // namespace

// A pointer slot of a step that is patched at every run: operand k (or result k when out).
struct Ref {
  int step, k;
  bool out;
};

struct Executable::Impl {
  std::unique_ptr<Graph> graph;
  std::vector<Step> steps;
  int fused_groups = 0;
  BufferPlan plan;
  std::byte* arena = nullptr;
  std::vector<int> root;  // value -> the value whose storage it shares (reshapes are views)
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
    std::byte* spill = nullptr;
    bool spilled = false;  // this run
  };
  std::vector<Home> homes;
  std::vector<int> home_at_pos;  // output position -> home index, or -1 (input or repeated value)
  std::vector<int> output_values;
  int64_t output_bytes = 0;
  std::vector<double> step_seconds;  // per step, summed over runs; empty unless profiling
  int profiled_runs = 0;
  struct Range {
    const std::byte *lo, *hi;
    int pos;     // output position, or -1 - input index
  };
  std::vector<Range> ranges;  // run-time scratch, reserved at compile time
  ~Impl() {
    std::free(arena);
    for (Home& h : homes) std::free(h.spill);
  }
};

Executable::Executable(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executable::~Executable() = default;

std::unique_ptr<Executable> Executable::compile(const Graph& src, const CompileOptions& opt) {
  auto impl = std::make_unique<Impl>();
  apply_thread_settings();
  src.verify();
  std::unique_ptr<Graph> prepared;
  if (opt.compute_dtype != DType::f32) prepared = autocast(src, opt.compute_dtype);
  const Graph& in_graph = prepared ? *prepared : src;
  impl->graph = opt.optimize ? dce(*cse(in_graph)) : in_graph.clone();
  const bool fuse_on = opt.fuse_elementwise && !env().disable_fusion;
  const Graph& g = *impl->graph;
  const auto& nodes = g.nodes();

  // Consumers per value, to find which group values escape.
  std::vector<std::vector<int>> users(g.values().size());
  for (size_t i = 0; i < nodes.size(); ++i)
    for (int v : nodes[i].inputs) users[v].push_back(static_cast<int>(i));
  std::vector<char> is_output(g.values().size(), 0);
  for (int v : g.outputs()) is_output[v] = 1;

  // Partition the schedule into units: fused groups (run at their last member) and single nodes.
  // Several groups may be open at once, one per element count, so that interleaved chains of
  // different sizes (forward and backward, bias and row statistics) each fuse. A node that reads
  // an open group without joining it closes that group, which then runs before the node; this
  // keeps "order units by last member" a valid schedule.
  struct Unit {
    std::vector<int> nodes;
    bool fused = false;
  };
  std::vector<Unit> units;
  std::map<int64_t, int> open_by_count;  // element count -> open fused unit
  std::vector<int> unit_of(nodes.size(), -1);
  constexpr size_t kMaxGroup = 48;
  constexpr int kWindow = 32;  // a group left alone for this many nodes closes (bounds lifetimes)
  auto close = [&](int u) {
    for (auto it = open_by_count.begin(); it != open_by_count.end(); ++it)
      if (it->second == u) {
        open_by_count.erase(it);
        return;
      }
  };
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    for (auto it = open_by_count.begin(); it != open_by_count.end();)
      it = units[it->second].nodes.back() + kWindow < static_cast<int>(i) ? open_by_count.erase(it) : std::next(it);
    std::vector<int> reads;  // open groups this node reads
    for (int v : n.inputs) {
      int p = g.values()[v].producer;
      if (p < 0) continue;
      int u = unit_of[p];
      bool is_open = false;
      for (auto& [cnt, ou] : open_by_count) is_open = is_open || ou == u;
      if (is_open && std::find(reads.begin(), reads.end(), u) == reads.end()) reads.push_back(u);
    }
    int64_t count = n.outputs.empty() ? -1 : g.type(n.outputs[0]).numel();
    auto cand = open_by_count.find(count);
    int join = (cand != open_by_count.end() && units[cand->second].nodes.size() < kMaxGroup) ? cand->second : -1;
    // A broadcast fuses as a strided load of an external operand, never of a value inside its group.
    // A reshape keeps the flat order, so in a group it is only a new name for its operand's tile.
    bool fuse = fuse_on && (fusible(g, n) || is_reshape(n) ||
                            (is_broadcast(n) && std::find(reads.begin(), reads.end(), join) == reads.end()));
    if (!fuse_on && fusible(g, n)) fuse = true;  // a single-node loop, never joined
    for (int u : reads)
      if (!(fuse && fuse_on && u == join)) close(u);
    if (fuse && fuse_on && join >= 0 && open_by_count.count(count)) {
      units[join].nodes.push_back(static_cast<int>(i));
      unit_of[i] = join;
      continue;
    }
    units.push_back({{static_cast<int>(i)}, fuse});
    unit_of[i] = static_cast<int>(units.size()) - 1;
    if (fuse && fuse_on) open_by_count[count] = unit_of[i];
  }
  // A lone broadcast or reshape computes nothing: run it with its own kernel (or as a view).
  for (Unit& u : units)
    if (u.fused && u.nodes.size() == 1 && (is_broadcast(nodes[u.nodes[0]]) || is_reshape(nodes[u.nodes[0]])) &&
        cpu::find_kernel(nodes[u.nodes[0]].prim->name))
      u.fused = false;
  // Order units by the position of their last member (a group runs when it is complete).
  std::vector<int> order(units.size());
  for (size_t u = 0; u < units.size(); ++u) order[u] = static_cast<int>(u);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return units[a].nodes.back() < units[b].nodes.back(); });

  // Reshapes outside fused groups are views: their result shares the operand's storage (one that
  // is itself a graph output is copied, so that outputs never alias each other).
  impl->root.resize(g.values().size());
  for (size_t v = 0; v < g.values().size(); ++v) impl->root[v] = static_cast<int>(v);
  std::vector<char> is_view(nodes.size(), 0);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (is_reshape(n) && !units[unit_of[i]].fused && !is_output[n.outputs[0]]) {
      is_view[i] = 1;
      impl->root[n.outputs[0]] = impl->root[n.inputs[0]];
    }
  }
  const std::vector<int>& root = impl->root;

  // Build steps.
  std::vector<char> in_group(g.values().size(), 0);  // marks the current group's values
  for (int u : order) {
    const Unit& unit = units[u];
    Step st;
    if (unit.fused) {
      cpu::FusedGroup grp;
      grp.nodes = unit.nodes;
      for (int ni : unit.nodes) in_group[nodes[ni].outputs[0]] = 1;
      for (int ni : unit.nodes) {
        for (int v : nodes[ni].inputs)
          if (!in_group[v] && std::find(grp.ext_inputs.begin(), grp.ext_inputs.end(), v) == grp.ext_inputs.end())
            grp.ext_inputs.push_back(v);
        int out = nodes[ni].outputs[0];
        bool escapes = is_output[out];
        for (int user : users[out]) escapes = escapes || unit_of[user] != u;
        if (escapes) grp.ext_outputs.push_back(out);
      }
      for (int ni : unit.nodes) in_group[nodes[ni].outputs[0]] = 0;
      st.kernel = cpu::make_fused_kernel(g, grp);
      st.in_values = grp.ext_inputs;
      st.out_values = grp.ext_outputs;
      for (int ni : unit.nodes) st.label += (st.label.empty() ? "fused{" : ",") + nodes[ni].prim->name;
      st.label += "}";
      st.alias_safe = true;
      ++impl->fused_groups;
    } else {
      const Node& n = nodes[unit.nodes[0]];
      if (is_view[unit.nodes[0]]) continue;
      const cpu::KernelFactory* f = cpu::find_kernel(n.prim->name);
      if (!f) throw Error("[compile] no CPU kernel for primitive '" + n.prim->name + "'");
      std::vector<TensorType> in_t, out_t;
      for (int v : n.inputs) in_t.push_back(g.type(v));
      for (int v : n.outputs) out_t.push_back(g.type(v));
      st.kernel = (*f)(cpu::KernelSpec{in_t, out_t, n.attrs});
      st.in_values = n.inputs;
      st.out_values = n.outputs;
      st.label = n.prim->name;
    }
    impl->steps.push_back(std::move(st));
  }

  // Returned values: the first position of each computed value is its home.
  const size_t nv = g.values().size();
  std::vector<int> home_of(nv, -1);
  impl->output_values = g.outputs();
  if (opt.profile || env().profile) impl->step_seconds.assign(impl->steps.size(), 0.0);
  impl->home_at_pos.assign(g.outputs().size(), -1);
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    int v = g.outputs()[o];
    if (g.values()[v].producer < 0 || home_of[v] >= 0) continue;
    home_of[v] = static_cast<int>(impl->homes.size());
    impl->home_at_pos[o] = home_of[v];
    Impl::Home h;
    h.value = v;
    h.pos = static_cast<int>(o);
    h.producer_step = -1;
    h.nbytes = g.type(v).nbytes();
    impl->homes.push_back(std::move(h));
  }

  for (int v : g.outputs()) impl->output_bytes += g.type(v).nbytes();

  // Buffer plan over the steps, on storage roots; inputs and homes live in caller memory.
  std::vector<char> external(nv, 0);
  for (int v : g.inputs()) external[v] = 1;
  for (const Impl::Home& h : impl->homes) external[h.value] = 1;
  std::vector<PlanStep> pst;
  for (const Step& st : impl->steps) {
    PlanStep ps{{}, st.out_values};
    for (int v : st.in_values) ps.in.push_back(root[v]);
    pst.push_back(std::move(ps));
  }
  std::vector<int> live_to_end;
  for (int v : g.outputs()) live_to_end.push_back(root[v]);
  impl->plan = plan_buffers(g, pst, external, live_to_end);
  if (opt.memory_limit_bytes > 0 && impl->plan.peak_bytes + impl->output_bytes > opt.memory_limit_bytes) {
    std::ostringstream os;
    os << "[compile] the step needs " << impl->plan.peak_bytes + impl->output_bytes << " bytes ("
       << impl->plan.peak_bytes << " of working memory + " << impl->output_bytes << " of outputs), over the limit of "
       << opt.memory_limit_bytes << " bytes. Largest live buffers at the peak:\n"
       << impl->plan.report(g);
    std::vector<const Impl::Home*> big;
    for (const Impl::Home& h : impl->homes) big.push_back(&h);
    std::sort(big.begin(), big.end(), [](auto* a, auto* b) { return a->nbytes > b->nbytes; });
    for (size_t i = 0; i < big.size() && i < 5; ++i)
      os << "  output " << big[i]->pos << ": %" << big[i]->value << " " << type_str(g.type(big[i]->value)) << " "
         << big[i]->nbytes << " bytes\n";
    os << "Raise the limit, shrink the batch, or enable rematerialization.";
    throw Error(os.str());
  }
  size_t bytes = static_cast<size_t>((impl->plan.peak_bytes + 63) / 64 * 64 + 64);
  impl->arena = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
  if (!impl->arena) throw Error("[compile] could not allocate the " + std::to_string(bytes) + "-byte arena");

  // Pointers: arena offsets now, caller memory patched at every run.
  std::vector<int> input_index(nv, -1);
  for (size_t i = 0; i < g.inputs().size(); ++i) input_index[g.inputs()[i]] = static_cast<int>(i);
  impl->input_refs.resize(g.inputs().size());
  impl->input_last_step.assign(g.inputs().size(), -1);
  impl->input_is_output.assign(g.inputs().size(), 0);
  for (int v : g.outputs())
    if (input_index[v] >= 0) impl->input_is_output[input_index[v]] = 1;
  for (size_t s = 0; s < impl->steps.size(); ++s) {
    Step& st = impl->steps[s];
    int si = static_cast<int>(s);
    for (size_t k = 0; k < st.in_values.size(); ++k) {
      int r = root[st.in_values[k]], ki = static_cast<int>(k);
      if (input_index[r] >= 0) {
        impl->input_refs[input_index[r]].push_back({si, ki, false});
        impl->input_last_step[input_index[r]] = si;
      } else if (home_of[r] >= 0) {
        impl->homes[home_of[r]].refs.push_back({si, ki, false});
      }
      st.in_ptrs.push_back(external[r] ? nullptr : impl->arena + impl->plan.offset[r]);
    }
    for (size_t k = 0; k < st.out_values.size(); ++k) {
      int v = st.out_values[k];
      if (home_of[v] >= 0) {
        impl->homes[home_of[v]].refs.push_back({si, static_cast<int>(k), true});
        impl->homes[home_of[v]].producer_step = si;
      }
      st.out_ptrs.push_back(external[v] ? nullptr : impl->arena + impl->plan.offset[v]);
    }
  }
  impl->ranges.reserve(g.inputs().size() + g.outputs().size());
  auto exe = std::unique_ptr<Executable>(new Executable(std::move(impl)));
  PX_LOG(debug) << "compiled " << exe->graph().nodes().size() << " nodes\n" << exe->summary();
  if (!env().dump_dir.empty()) dump(*exe, env().dump_dir);
  return exe;
}

std::vector<Array> Executable::run(const std::vector<Array>& inputs) {
  std::vector<Array> outs;
  for (int v : impl_->output_values) outs.emplace_back(impl_->graph->type(v).dtype, impl_->graph->type(v).shape);
  run_into(inputs, outs);
  return outs;
}

void Executable::run_into(const std::vector<Array>& inputs, std::vector<Array>& outputs) {
  const Graph& g = *impl_->graph;
  if (inputs.size() != g.inputs().size())
    throw Error("[run] expected " + std::to_string(g.inputs().size()) + " inputs, got " + std::to_string(inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorType& want = g.type(g.inputs()[i]);
    auto name = [&] { return g.input_names()[i].empty() ? std::string() : " ('" + g.input_names()[i] + "')"; };
    if (inputs[i].type() != want)
      throw Error("[run] input " + std::to_string(i) + name() + " has type " + type_str(inputs[i].type()) +
                  " but the graph was traced with " + type_str(want));
    if (!inputs[i].defined())
      throw Error("[run] input " + std::to_string(i) + name() + " is an empty px::Array (no data)");
  }
  if (outputs.size() != impl_->output_values.size())
    throw Error("[run] expected " + std::to_string(impl_->output_values.size()) + " output arrays, got " +
                std::to_string(outputs.size()));
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = impl_->output_values[o];
    if (outputs[o].type() != g.type(v) || !outputs[o].defined())
      throw Error("[run] output array " + std::to_string(o) + " has type " + type_str(outputs[o].type()) +
                  (outputs[o].defined() ? "" : " and no data") + ", expected " + type_str(g.type(v)));
  }
  Impl& im = *impl_;
  auto patch = [&](const std::vector<Ref>& refs, void* p) {
    for (const Ref& r : refs) {
      if (r.out) im.steps[r.step].out_ptrs[r.k] = p;
      else im.steps[r.step].in_ptrs[r.k] = p;
    }
  };
  for (size_t i = 0; i < inputs.size(); ++i) patch(im.input_refs[i], const_cast<void*>(inputs[i].raw()));

  // A home whose array overlaps another argument is spilled, except for an in-place update: the
  // home is exactly an input's array and that input is no longer read when the home is written.
  for (Impl::Home& h : im.homes) h.spilled = false;
  im.ranges.clear();
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].nbytes() > 0) {
      auto lo = static_cast<const std::byte*>(inputs[i].raw());
      im.ranges.push_back({lo, lo + inputs[i].nbytes(), -1 - static_cast<int>(i)});
    }
  for (size_t o = 0; o < outputs.size(); ++o)
    if (outputs[o].nbytes() > 0) {
      auto lo = static_cast<const std::byte*>(outputs[o].raw());
      im.ranges.push_back({lo, lo + outputs[o].nbytes(), static_cast<int>(o)});
    }
  std::sort(im.ranges.begin(), im.ranges.end(), [](const Impl::Range& a, const Impl::Range& b) { return a.lo < b.lo; });
  for (size_t a = 0; a < im.ranges.size(); ++a)
    for (size_t b = a + 1; b < im.ranges.size() && im.ranges[b].lo < im.ranges[a].hi; ++b) {
      const Impl::Range &x = im.ranges[a], &y = im.ranges[b];
      for (const Impl::Range* r : {&x, &y}) {
        const Impl::Range* other = r == &x ? &y : &x;
        if (r->pos < 0 || im.home_at_pos[r->pos] < 0) continue;
        Impl::Home& h = im.homes[im.home_at_pos[r->pos]];
        int last = other->pos < 0 ? im.input_last_step[-1 - other->pos] : 0;
        bool in_place = other->pos < 0 && other->lo == r->lo && other->hi == r->hi &&
                        (last < h.producer_step || (last == h.producer_step && im.steps[last].alias_safe)) &&
                        !im.input_is_output[-1 - other->pos];
        if (!in_place) h.spilled = true;
      }
    }
  for (Impl::Home& h : im.homes) {
    void* dst = outputs[h.pos].raw();
    if (h.spilled) {
      if (!h.spill) {  // first run with this aliasing: allocate once, reuse afterwards
        h.spill = static_cast<std::byte*>(std::aligned_alloc(64, static_cast<size_t>((h.nbytes + 63) / 64 * 64 + 64)));
        if (!h.spill) throw Error("[run] out of memory for a " + std::to_string(h.nbytes) + "-byte output copy");
      }
      dst = h.spill;
    }
    patch(h.refs, dst);
  }

  apply_thread_settings();
  if (im.step_seconds.empty()) {
    for (Step& st : im.steps) st.kernel(st.in_ptrs.data(), st.out_ptrs.data());
  } else {
    for (size_t s = 0; s < im.steps.size(); ++s) {
      auto t0 = std::chrono::steady_clock::now();
      im.steps[s].kernel(im.steps[s].in_ptrs.data(), im.steps[s].out_ptrs.data());
      im.step_seconds[s] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    ++im.profiled_runs;
  }

  // Inputs returned as outputs are copied first (a spilled home may overwrite that input next).
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = im.root[im.output_values[o]];
    if (g.values()[v].producer >= 0 || outputs[o].nbytes() == 0) continue;
    const void* src = inputs[g.values()[v].output_index].raw();
    if (src != outputs[o].raw()) std::memmove(outputs[o].raw(), src, static_cast<size_t>(outputs[o].nbytes()));
  }
  for (Impl::Home& h : im.homes)
    if (h.spilled && h.nbytes) std::memcpy(outputs[h.pos].raw(), h.spill, static_cast<size_t>(h.nbytes));
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = im.output_values[o];
    if (g.values()[v].producer < 0 || im.home_at_pos[o] >= 0 || outputs[o].nbytes() == 0) continue;
    for (const Impl::Home& h : im.homes)
      if (h.value == v && outputs[h.pos].raw() != outputs[o].raw())
        std::memmove(outputs[o].raw(), outputs[h.pos].raw(), static_cast<size_t>(outputs[o].nbytes()));
  }
}

int64_t Executable::peak_bytes() const { return impl_->plan.peak_bytes; }
int64_t Executable::output_bytes() const { return impl_->output_bytes; }
int Executable::num_steps() const { return static_cast<int>(impl_->steps.size()); }
int Executable::num_fused_groups() const { return impl_->fused_groups; }
const Graph& Executable::graph() const { return *impl_->graph; }

std::string Executable::profile_report(int top) const {
  const Impl& im = *impl_;
  if (im.step_seconds.empty()) return "profiling is off: compile with CompileOptions::profile or set PX_PROFILE=1\n";
  if (im.profiled_runs == 0) return "no runs profiled yet\n";
  // Aggregate by kernel label (fused groups by their op list).
  std::map<std::string, std::pair<double, int>> by_label;
  double total = 0;
  for (size_t s = 0; s < im.steps.size(); ++s) {
    auto& e = by_label[im.steps[s].label];
    e.first += im.step_seconds[s] / im.profiled_runs;
    e.second += 1;
    total += im.step_seconds[s] / im.profiled_runs;
  }
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(by_label.begin(), by_label.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  std::ostringstream os;
  os << "profile: " << im.profiled_runs << " runs, " << total * 1e3 << " ms per run in kernels\n";
  for (size_t i = 0; i < rows.size() && static_cast<int>(i) < top; ++i)
    os << "  " << rows[i].second.first * 1e3 << " ms  " << 100.0 * rows[i].second.first / total << "%  x"
       << rows[i].second.second << "  " << rows[i].first.substr(0, 100) << "\n";
  return os.str();
}

std::string Executable::summary() const {
  std::ostringstream os;
  os << "executable: " << impl_->steps.size() << " steps, " << impl_->fused_groups << " fused groups, peak "
     << impl_->plan.peak_bytes << " bytes (+" << impl_->output_bytes << " bytes of outputs)\n";
  for (size_t s = 0; s < impl_->steps.size(); ++s) {
    const Step& st = impl_->steps[s];
    os << "  " << s << ": " << st.label << " ->";
    for (int v : st.out_values) {
      os << " %" << v;
      if (impl_->plan.offset[v] >= 0) os << "@" << impl_->plan.offset[v];
      else os << "@out";
    }
    os << "\n";
  }
  return os.str();
}

}  // namespace px
