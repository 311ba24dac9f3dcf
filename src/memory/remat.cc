// The remat pass over a traced training step: the backward pass reads only the forward values
// the policy saves and recomputes the others from them, just before their first use there.
#include <fmt/format.h>

#include <atomic>
#include <string>
#include <vector>

#include "core/enum_names.h"
#include "ir/primitive.h"
#include "memory/rewrite.h"
#include "memory/step_program.h"
#include "ops/prims.h"

namespace px {

namespace {
constexpr const char* kPolicyNames[] = {
    "none", "full", "nothing_saveable", "dots_saveable", "dots_with_no_batch_dims_saveable", "names", "offload", "auto"};
static_assert(std::size(kPolicyNames) == static_cast<size_t>(RematPolicy::automatic) + 1);
}  // namespace

const char* remat_policy_name(RematPolicy p) { return enum_name(p, kPolicyNames); }

RematPolicy parse_remat_policy(const std::string& name) {
  if (auto p = enum_from_name<RematPolicy>(name, kPolicyNames)) return *p;
  throw UserError("[remat] unknown policy '" + name +
                  "'; the policies are none, full, nothing_saveable, dots_saveable, "
                  "dots_with_no_batch_dims_saveable, names, offload, auto");
}

namespace {

bool is_tag(const Node& n, const char* name) { return n.prim == prims::tag() && n.attrs.s("name") == name; }
bool is_boundary(const Node& n) {
  return is_tag(n, "layer_input") || is_tag(n, "layers_end") || is_tag(n, "remat_begin") || is_tag(n, "remat_end");
}

// Whether a policy saves the result of forward node n for the backward pass.
bool policy_saves(RematPolicy policy, const std::vector<std::string>& names, const Node& n) {
  switch (policy) {
    case RematPolicy::none:
      return true;
    case RematPolicy::dots_saveable:
    case RematPolicy::offload:
      // Contractions: matmuls and the fused attention (its output; scores are never materialized).
      return n.prim == prims::dot_general() || n.prim == prims::attention();
    case RematPolicy::dots_with_no_batch_dims_saveable:
      return n.prim == prims::dot_general() && n.attrs.ints("lhs_batch").empty();
    case RematPolicy::names:
      if (n.prim != prims::tag()) return false;
      for (const auto& pattern : names)
        if (glob_match(pattern, n.attrs.s("name"))) return true;
      return false;
    default:
      return false;
  }
}

std::vector<std::string> split_names(const std::string& s) {
  std::vector<std::string> out;
  for (size_t start = 0; start < s.size();) {
    size_t comma = s.find(',', start);
    if (comma == std::string::npos) comma = s.size();
    if (comma > start) out.push_back(s.substr(start, comma - start));
    start = comma + 1;
  }
  return out;
}

// A function wrapped by px::remat: its policy, and its nodes (between its begin and end tags).
struct Region {
  RematPolicy policy;
  std::vector<std::string> names;
};

// Saved forward values read by the backward pass that `offload` keeps in pinned_host memory: each
// gets a transfer to the host right after its producer and a fetch before its backward readers
// (one per cluster of nearby readers), prefetched by layer.
StepProgram offload_residuals(StepProgram p, const std::vector<int>& host, const std::vector<std::string>& group_of) {
  const Graph& g = *p.graph;
  const std::vector<Node>& nodes = g.nodes();
  std::vector<ValueInfo> values = g.values();
  std::vector<int> to_host(values.size(), -1), fetched(values.size(), -1), last_use(values.size(), -1);
  std::vector<char> offloaded(values.size(), 0);
  for (int v : host) offloaded[v] = 1;
  std::vector<Node> out;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    Node n = nodes[i];
    // Each transfer is where its node is: the send after its producer, the fetch before its reader.
    auto transfer = [&](int v, MemoryKind to, const std::string& group) {
      return memory_pass::add_transfer(out, values, v, to, n.facts, group);
    };
    const bool forward = p.is_forward(i);
    if (!forward)
      for (int& v : n.inputs) {
        if (!offloaded[v]) continue;
        if (fetched[v] < 0 || i - last_use[v] > memory_pass::kFetchReuseNodes)
          fetched[v] = transfer(to_host[v], MemoryKind::device, "residuals." + group_of[v]);
        last_use[v] = i;
        v = fetched[v];
      }
    out.push_back(n);
    if (forward)
      for (int v : n.outputs)
        if (offloaded[v]) to_host[v] = transfer(v, MemoryKind::pinned_host, "");
  }
  p.graph = memory_pass::rebuilt(std::move(out), std::move(values), g, g.outputs());
  return p;
}

// The layers of one microbatch's forward pass.
int count_layers(const Graph& g) {
  int n = 0;
  for (const Node& node : g.nodes())
    n += node.facts.in(StepPhase::forward, 0) && is_tag(node, "layer_input");
  return n;
}

}  // namespace

StepProgram StepProgram::clone() const {
  StepProgram c;
  c.graph = graph->clone();
  c.n_params = n_params;
  c.n_state = n_state;
  c.n_batch = n_batch;
  c.paths = paths;
  c.microbatches = microbatches;
  return c;
}

namespace {
// Per param, the value whose fact `field` names it (of microbatch k's nodes, k >= 0).
std::vector<int> gradient_values(const StepProgram& p, int ValueInfo::*field, int k) {
  std::vector<int> out(p.n_params, -1);
  const std::vector<ValueInfo>& values = p.graph->values();
  for (size_t v = 0; v < values.size(); ++v) {
    const int i = values[v].*field;
    if (i < 0 || (k >= 0 && (values[v].producer < 0 || p.facts(values[v].producer).microbatch != k))) continue;
    if (static_cast<size_t>(i) >= out.size() || out[i] >= 0)
      throw InternalError(fmt::format("[step] value %{} is marked as param {}'s gradient, which {}", v, i,
                                      static_cast<size_t>(i) >= out.size() ? "is not a param" : "another value is"));
    out[i] = static_cast<int>(v);
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i] < 0) throw InternalError(fmt::format("[step] no value is marked as param {}'s gradient", i));
  return out;
}
}  // namespace

std::vector<int> StepProgram::grads() const {
  return gradient_values(*this, &ValueInfo::grad_of, -1);
}

std::vector<int> StepProgram::micro_grads(int k) const {
  return gradient_values(*this, &ValueInfo::micro_grad_of, k);
}

std::pair<int, int> StepProgram::span(StepPhase phase, int k) const {
  int first = -1, last = -1;
  for (int i = 0; i < static_cast<int>(graph->nodes().size()); ++i)
    if (facts(i).in(phase, k)) {
      if (first < 0) first = i;
      last = i;
    }
  return first < 0 ? std::pair{0, 0} : std::pair{first, last + 1};
}

namespace {

// What the remat options save of a step's forward passes: per forward node its microbatch, the
// px::remat region it is in and its layer, and from them the policy that governs it.
class Saving {
 public:
  Saving(const Graph& g, const RematOptions& o) : g_(g), nodes_(g.nodes()), o_(o), N_(static_cast<int>(nodes_.size())) {
    micro_of_.assign(N_, -1);
    for (int i = 0; i < N_; ++i)
      if (nodes_[i].facts.phase == StepPhase::forward) micro_of_[i] = nodes_[i].facts.microbatch;
    find_regions();
    find_layers();
    is_output_.assign(g.values().size(), 0);
    for (int v : g.outputs()) is_output_[v] = 1;
  }

  // Whether anything is recomputed at all.
  bool any() const { return !(o_.policy == RematPolicy::none || o_.layers == 0) || !regions_.empty(); }
  bool forward(int i) const { return i >= 0 && i < N_ && micro_of_[i] >= 0; }

  // Whether forward value v is kept for the backward pass (else recomputed there).
  bool saved(int v) const {
    const int i = g_.values()[v].producer;
    if (!forward(i) || is_output_[v]) return true;
    const Node& n = nodes_[i];
    if (is_boundary(n)) return true;
    return policy_saves(policy_of(i), region_of_[i] >= 0 ? regions_[region_of_[i]].names : o_.names, n);
  }

  // `offload`: the values it saves, and the layer inputs its layers start from, go to the host.
  bool offloaded(int v) const {
    const int i = g_.values()[v].producer;
    if (!forward(i) || is_output_[v]) return false;
    const Node& n = nodes_[i];
    if (is_tag(n, "layer_input")) {
      for (int j = i + 1; forward(j); ++j)
        if (!is_boundary(nodes_[j])) return policy_of(j) == RematPolicy::offload;
      return false;
    }
    return policy_of(i) == RematPolicy::offload && saved(v) && !is_boundary(n);
  }

  // The prefetch group of an offloaded value: its layer (or region), and its microbatch.
  std::string host_group(int v) const {
    const int i = g_.values()[v].producer;
    const int group = region_of_[i] >= 0                             ? 100000 + region_of_[i]
                      : is_boundary(nodes_[i]) && forward(i + 1) ? layer_[i + 1]
                                                                     : layer_[i];
    return (micro_of_[i] > 0 ? std::to_string(micro_of_[i]) + "." : "") + std::to_string(group);
  }

 private:
  // The policy that governs forward node i (none: everything saved).
  RematPolicy policy_of(int i) const {
    if (region_of_[i] >= 0) return regions_[region_of_[i]].policy;
    if (layer_[i] == -2) return RematPolicy::none;
    if (layer_[i] < 0) return o_.policy == RematPolicy::nothing_saveable ? o_.policy : RematPolicy::none;
    return o_.policy;
  }

  // Functions wrapped by px::remat: their nodes follow their policy, whatever the step's.
  void find_regions() {
    region_of_.assign(N_, -1);
    std::vector<int64_t> open_ids;
    std::vector<int> open;
    for (int i = 0; i < N_; ++i) {
      if (!forward(i)) continue;
      const Node& n = nodes_[i];
      if (is_tag(n, "remat_begin")) {
        const int64_t id = n.attrs.i("region");
        if (open_ids.empty() || open_ids.back() != id) {
          open_ids.push_back(id);
          open.push_back(static_cast<int>(regions_.size()));
          regions_.push_back({parse_remat_policy(n.attrs.s("policy")), split_names(n.attrs.s("names"))});
        }
      } else if (is_tag(n, "remat_end")) {
        if (!open_ids.empty() && open_ids.back() == n.attrs.i("region")) {
          open_ids.pop_back();
          open.pop_back();
        }
      } else if (!open.empty()) {
        region_of_[i] = open.back();
      }
    }
  }

  // The layer of each forward node (-1: outside the layers, -2: past the layers to rematerialize);
  // the boundary tags belong to none. Each microbatch counts its layers from 0.
  void find_layers() {
    layer_.assign(N_, -1);
    bool tagged = false;
    for (int i = 0, cur = -1, count = 0; i < N_; ++i) {
      if (!forward(i)) continue;
      if (i == 0 || micro_of_[i - 1] != micro_of_[i]) cur = -1, count = 0;
      if (is_tag(nodes_[i], "layer_input")) {
        cur = count++;
        if (o_.layers >= 0 && cur >= o_.layers) cur = -2;  // saved
        tagged = true;
        continue;
      }
      if (is_tag(nodes_[i], "layers_end")) {
        cur = -1;
        continue;
      }
      layer_[i] = cur;
    }
    if (!tagged)  // one layer: the whole forward pass
      for (int i = 0; i < N_; ++i) layer_[i] = forward(i) ? 0 : -1;
  }

  const Graph& g_;
  const std::vector<Node>& nodes_;
  const RematOptions& o_;
  const int N_;
  std::vector<int> micro_of_;  // per node: the microbatch whose forward pass it is in (-1: none)
  std::vector<Region> regions_;
  std::vector<int> region_of_, layer_;
  std::vector<char> is_output_;
};

// The step's nodes with each backward reader of a value `saving` does not save reading a copy
// recomputed just before it (from saved values and inputs); the copies run where their reader
// runs. Adds the copies' FLOPs to `flops` and lists the saved values read back that `saving`
// offloads in `host`.
StepProgram recompute_unsaved(StepProgram p, const Saving& saving, double& flops, std::vector<int>& host) {
  const Graph& g = *p.graph;
  const std::vector<Node>& nodes = g.nodes();
  const int N = static_cast<int>(nodes.size());
  std::vector<Node> out;
  out.reserve(nodes.size());
  std::vector<ValueInfo> values = g.values();
  std::vector<int> clone(values.size(), -1);  // forward value -> its recomputed copy
  // The copy of v for a reader with facts `at`, emitting the copies of its producers first
  // (post-order, iterative: a chain through every layer is thousands of nodes deep).
  auto recompute = [&](int v, const NodeFacts& at) {
    std::vector<std::pair<int, bool>> stack{{v, false}};
    while (!stack.empty()) {
      auto [u, expanded] = stack.back();
      stack.pop_back();
      if (saving.saved(u) || clone[u] >= 0) continue;
      const Node& n = nodes[g.values()[u].producer];
      if (!expanded) {
        stack.push_back({u, true});
        for (int in : n.inputs)
          if (!saving.saved(in) && clone[in] < 0) stack.push_back({in, false});
        continue;
      }
      Node c = n;
      std::vector<TensorType> ins, outs;
      for (int& in : c.inputs) {
        if (!saving.saved(in)) in = clone[in];
        ins.push_back(values[in].type);
      }
      c.attrs.set("remat", int64_t{1});  // a distinct attribute keeps CSE from merging it back
      c.facts = at;
      for (int& o : c.outputs) {
        outs.push_back(values[o].type);
        clone[o] = static_cast<int>(values.size());
        values.push_back(values[o]);  // the same facts: an activation where the original lives
        o = clone[o];
      }
      flops += cost_of(*c.prim, ins, outs, c.attrs).flops;
      out.push_back(std::move(c));
    }
    return clone[v];
  };
  std::vector<char> read_back(values.size(), 0);  // values of g read outside the forward passes
  for (int i = 0; i < N; ++i) {
    Node b = nodes[i];
    const size_t first = out.size();
    if (!saving.forward(i))
      for (int& in : b.inputs)
        if (!saving.saved(in)) in = recompute(in, b.facts);
    out.push_back(std::move(b));
    if (!saving.forward(i))
      for (size_t j = first; j < out.size(); ++j)
        for (int v : out[j].inputs)
          if (static_cast<size_t>(v) < read_back.size()) read_back[v] = 1;
  }
  for (int v = 0; v < static_cast<int>(g.values().size()); ++v)
    if (read_back[v] && saving.offloaded(v)) host.push_back(v);
  p.graph = memory_pass::rebuilt(std::move(out), std::move(values), g, g.outputs());
  return p;
}

}  // namespace

StepProgram remat_step(StepProgram p, const RematOptions& o, double* recomputed_flops) {
  if (recomputed_flops) *recomputed_flops = 0;
  if (o.policy == RematPolicy::automatic)
    throw UserError("[remat] policy 'auto' needs a budget: use TrainStep with "
                    "RematOptions::budget_bytes or CompileOptions::memory_limit_bytes");
  if (o.policy == RematPolicy::names && o.names.empty())
    throw UserError("[remat] policy 'names' needs RematOptions::names: the px::tag names of the values to save");
  const Saving saving(*p.graph, o);
  if (!saving.any()) return p;
  double flops = 0;
  std::vector<int> host;  // saved values the backward pass reads that `offload` keeps on the host
  std::vector<std::string> group_of(p.graph->values().size());
  for (int v = 0; v < static_cast<int>(group_of.size()); ++v)
    if (saving.forward(p.graph->values()[v].producer) && saving.offloaded(v)) group_of[v] = saving.host_group(v);
  p = recompute_unsaved(std::move(p), saving, flops, host);
  if (recomputed_flops) *recomputed_flops = flops;
  if (!host.empty()) p = offload_residuals(std::move(p), host, group_of);
  return p;
}

TensorFn remat(TensorFn fn, RematPolicy policy, std::vector<std::string> names) {
  if (!fn) throw UserError("[remat] no function given");
  if (policy == RematPolicy::automatic)
    throw UserError("[remat] px::remat takes a fixed policy; 'auto' needs the whole step's budget: use "
                    "TrainStepOptions::remat with RematPolicy::automatic");
  if (policy == RematPolicy::names && names.empty())
    throw UserError("[remat] policy 'names' needs the px::tag names of the values to save");
  std::string joined;
  for (const std::string& n : names) joined += (joined.empty() ? "" : ",") + n;
  return [fn = std::move(fn), policy, joined](const std::vector<Tensor>& in) {
    static std::atomic<int64_t> next_region{0};
    const int64_t id = next_region++;
    auto mark = [&](const Tensor& x, const char* what) {
      return emit1("tag", {x},
                   {{"name", std::string(what)}, {"region", id}, {"policy", std::string(remat_policy_name(policy))},
                    {"names", joined}});
    };
    std::vector<Tensor> args;
    for (const Tensor& x : in) args.push_back(mark(x, "remat_begin"));
    std::vector<Tensor> out = fn(args);
    for (Tensor& y : out) y = mark(y, "remat_end");
    return out;
  };
}

TensorFn remat_model(std::vector<TensorFn> blocks, RematPolicy policy) {
  for (TensorFn& b : blocks) b = remat(std::move(b), policy);
  return [blocks = std::move(blocks)](const std::vector<Tensor>& in) {
    std::vector<Tensor> x = in;
    for (const TensorFn& b : blocks) x = b(x);
    return x;
  };
}

StepProgram remat_automatic(StepProgram p, int64_t budget, const std::function<int64_t(const StepProgram&)>& peak_of,
                            RematOptions* chosen) {
  if (budget <= 0)
    throw UserError("[remat] policy 'auto' needs a budget: set RematOptions::budget_bytes or "
                    "CompileOptions::memory_limit_bytes (bytes per device)");
  auto with = [&](RematOptions o) { return remat_step(p.clone(), o); };
  const int layers = count_layers(*p.graph);  // per microbatch
  // Full remat of the first k layers: the peak falls as k grows; the least k that fits.
  auto fits_with = [&](int k) { return peak_of(with({RematPolicy::full, {}, k, 0})) <= budget; };
  int64_t none_peak = peak_of(p);
  if (none_peak <= budget) {
    if (chosen) *chosen = {RematPolicy::none, {}, -1, budget};
    return p;
  }
  if (layers > 0 && fits_with(layers)) {
    int lo = 1, hi = layers;  // fits at hi
    while (lo < hi) {
      int mid = (lo + hi) / 2;
      if (fits_with(mid)) hi = mid;
      else lo = mid + 1;
    }
    RematOptions o{RematPolicy::full, {}, hi, budget};
    if (chosen) *chosen = o;
    return remat_step(std::move(p), o);
  }
  StepProgram least = with({RematPolicy::nothing_saveable, {}, -1, 0});
  const int64_t least_peak = peak_of(least);
  if (least_peak <= budget) {
    if (chosen) *chosen = {RematPolicy::nothing_saveable, {}, -1, budget};
    return least;
  }
  throw UserError("[remat] auto: no policy fits the budget of " + std::to_string(budget) +
                  " bytes per device: without remat the step needs " + std::to_string(none_peak) +
                  ", with nothing_saveable " + std::to_string(least_peak) +
                  "; split the params and optimizer state over more devices (FSDP), use a smaller batch, or raise "
                  "the budget");
}

}  // namespace px
