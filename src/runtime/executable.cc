// Executable: topological schedule, elementwise fusion, liveness-based buffer plan, and a run
// loop that only calls prepared kernels on precomputed pointers.
#include "parallax/runtime.h"

#include <algorithm>
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
};

bool is_broadcast(const Node& n) { return n.prim->name == "broadcast_in_dim" && n.outputs.size() == 1; }

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

struct Executable::Impl {
  std::unique_ptr<Graph> graph;
  std::vector<Step> steps;
  int fused_groups = 0;
  BufferPlan plan;
  std::byte* arena = nullptr;
  // Where graph inputs are read: (step, operand) pairs patched at every run.
  std::vector<std::vector<std::pair<int, int>>> input_uses;
  std::vector<int> output_values;
  ~Impl() { std::free(arena); }
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
  // A group grows while nodes are fusible and have its element count; a node that reads the
  // open group but cannot join it closes the group, which then runs before that node.
  struct Unit {
    std::vector<int> nodes;
    bool fused = false;
  };
  std::vector<Unit> units;
  int open = -1;  // index of the open fused unit
  std::vector<int> unit_of(nodes.size(), -1);
  constexpr size_t kMaxGroup = 48;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    bool reads_open = false;
    if (open >= 0)
      for (int v : n.inputs) {
        int p = g.values()[v].producer;
        reads_open = reads_open || (p >= 0 && unit_of[p] == open);
      }
    // A broadcast of an external operand fuses as a strided load; of a group value it cannot.
    bool fuse = fusible(g, n) || (fuse_on && is_broadcast(n) && !reads_open);
    if (fuse && fuse_on && open >= 0 && units[open].nodes.size() < kMaxGroup &&
        g.type(n.outputs[0]).numel() == g.type(nodes[units[open].nodes[0]].outputs[0]).numel()) {
      units[open].nodes.push_back(static_cast<int>(i));
      unit_of[i] = open;
      continue;
    }
    if (fuse) {
      units.push_back({{static_cast<int>(i)}, true});
      unit_of[i] = static_cast<int>(units.size()) - 1;
      open = fuse_on ? unit_of[i] : -1;
      continue;
    }
    if (reads_open) open = -1;  // the group must run before this consumer
    units.push_back({{static_cast<int>(i)}, false});
    unit_of[i] = static_cast<int>(units.size()) - 1;
  }
  // A group of broadcasts alone computes nothing: run them with their own kernels.
  for (Unit& u : units) {
    if (!u.fused) continue;
    bool any_compute = false;
    for (int ni : u.nodes) any_compute = any_compute || !is_broadcast(nodes[ni]);
    if (!any_compute && u.nodes.size() == 1 && cpu::find_kernel(nodes[u.nodes[0]].prim->name)) u.fused = false;
  }
  // Order units by the position of their last member (a group runs when it is complete).
  std::vector<int> order(units.size());
  for (size_t u = 0; u < units.size(); ++u) order[u] = static_cast<int>(u);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return units[a].nodes.back() < units[b].nodes.back(); });

  // Build steps.
  std::vector<char> internal(g.values().size(), 0);  // values that never leave a fused tile
  for (int u : order) {
    const Unit& unit = units[u];
    Step st;
    if (unit.fused) {
      cpu::FusedGroup grp;
      grp.nodes = unit.nodes;
      std::vector<char> in_group(g.values().size(), 0);
      for (int ni : unit.nodes) in_group[nodes[ni].outputs[0]] = 1;
      for (int ni : unit.nodes) {
        for (int v : nodes[ni].inputs)
          if (!in_group[v] && std::find(grp.ext_inputs.begin(), grp.ext_inputs.end(), v) == grp.ext_inputs.end())
            grp.ext_inputs.push_back(v);
        int out = nodes[ni].outputs[0];
        bool escapes = is_output[out];
        for (int user : users[out]) escapes = escapes || unit_of[user] != u;
        if (escapes) grp.ext_outputs.push_back(out);
        else internal[out] = 1;
      }
      st.kernel = cpu::make_fused_kernel(g, grp);
      st.in_values = grp.ext_inputs;
      st.out_values = grp.ext_outputs;
      for (int ni : unit.nodes) st.label += (st.label.empty() ? "fused{" : ",") + nodes[ni].prim->name;
      st.label += "}";
      ++impl->fused_groups;
    } else {
      const Node& n = nodes[unit.nodes[0]];
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

  // Buffer plan over the steps.
  std::vector<char> external(g.values().size(), 0);
  for (int v : g.inputs()) external[v] = 1;
  std::vector<PlanStep> pst;
  for (const Step& st : impl->steps) pst.push_back({st.in_values, st.out_values});
  impl->plan = plan_buffers(g, pst, external, g.outputs());
  if (opt.memory_limit_bytes > 0 && impl->plan.peak_bytes > opt.memory_limit_bytes)
    throw Error("[compile] the step needs " + std::to_string(impl->plan.peak_bytes) +
                " bytes of working memory, over the limit of " + std::to_string(opt.memory_limit_bytes) +
                " bytes. Largest live buffers at the peak:\n" + impl->plan.report(g) +
                "Raise the limit, shrink the batch, or enable rematerialization.");
  size_t bytes = static_cast<size_t>((impl->plan.peak_bytes + 63) / 64 * 64 + 64);
  impl->arena = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
  if (!impl->arena) throw Error("[compile] could not allocate the " + std::to_string(bytes) + "-byte arena");

  impl->input_uses.resize(g.inputs().size());
  std::map<int, int> input_index;
  for (size_t i = 0; i < g.inputs().size(); ++i) input_index[g.inputs()[i]] = static_cast<int>(i);
  for (size_t s = 0; s < impl->steps.size(); ++s) {
    Step& st = impl->steps[s];
    for (size_t k = 0; k < st.in_values.size(); ++k) {
      int v = st.in_values[k];
      if (external[v]) {
        impl->input_uses[input_index[v]].push_back({static_cast<int>(s), static_cast<int>(k)});
        st.in_ptrs.push_back(nullptr);
      } else {
        st.in_ptrs.push_back(impl->arena + impl->plan.offset[v]);
      }
    }
    for (int v : st.out_values) st.out_ptrs.push_back(impl->arena + impl->plan.offset[v]);
  }
  impl->output_values = g.outputs();
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
    std::string name = g.input_names()[i].empty() ? "" : " ('" + g.input_names()[i] + "')";
    if (inputs[i].type() != want)
      throw Error("[run] input " + std::to_string(i) + name + " has type " + type_str(inputs[i].type()) +
                  " but the graph was traced with " + type_str(want));
    if (!inputs[i].defined())
      throw Error("[run] input " + std::to_string(i) + name + " is an empty px::Array (no data)");
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
  for (size_t i = 0; i < inputs.size(); ++i)
    for (auto [s, k] : impl_->input_uses[i]) impl_->steps[s].in_ptrs[k] = inputs[i].raw();
  apply_thread_settings();
  for (Step& st : impl_->steps) st.kernel(st.in_ptrs.data(), st.out_ptrs.data());
  for (size_t o = 0; o < outputs.size(); ++o) {
    int v = impl_->output_values[o];
    const void* src = nullptr;
    if (g.values()[v].producer < 0) {
      src = inputs[g.values()[v].output_index].raw();
    } else {
      src = impl_->arena + impl_->plan.offset[v];
    }
    if (outputs[o].nbytes()) std::memcpy(outputs[o].raw(), src, static_cast<size_t>(outputs[o].nbytes()));
  }
}

int64_t Executable::peak_bytes() const { return impl_->plan.peak_bytes; }
int Executable::num_steps() const { return static_cast<int>(impl_->steps.size()); }
int Executable::num_fused_groups() const { return impl_->fused_groups; }
const Graph& Executable::graph() const { return *impl_->graph; }

std::string Executable::summary() const {
  std::ostringstream os;
  os << "executable: " << impl_->steps.size() << " steps, " << impl_->fused_groups << " fused groups, peak "
     << impl_->plan.peak_bytes << " bytes\n";
  for (size_t s = 0; s < impl_->steps.size(); ++s) {
    const Step& st = impl_->steps[s];
    os << "  " << s << ": " << st.label << " ->";
    for (int v : st.out_values) os << " %" << v << "@" << impl_->plan.offset[v];
    os << "\n";
  }
  return os.str();
}

}  // namespace px
