// The offload pass over a traced training step: chosen params (and the optimizer state) live in
// pinned_host memory between steps; every device use of one reads a copy that a `transfer` node
// fetched into device memory shortly before, and values computed on the other side come back the
// same way. The schedule starts fetches ahead of use (the prefetch depth, counted in layers) and the
// runtime runs transfers on the backend's copy stream, so they overlap compute.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ir/primitive.h"
#include "ir/replay.h"
#include "memory/rewrite.h"
#include "memory/step_program.h"
#include "ops/prims.h"

namespace px {

namespace memory_pass {

int add_transfer(std::vector<Node>& nodes, std::vector<ValueInfo>& values, int v, MemoryKind to, const NodeFacts& at,
                 const std::string& group) {
  Node t;
  t.prim = prims::transfer();
  t.facts = at;
  t.attrs.set("to", std::string(memory_kind_name(to)));
  if (!group.empty()) t.attrs.set("group", group);
  t.inputs = {v};
  const int id = static_cast<int>(values.size());
  t.outputs = {id};
  values.push_back(values[v]);  // the same facts, but where it is sent, and not the gradient itself
  values.back().kind = to;
  values.back().grad_of = values.back().micro_grad_of = -1;
  nodes.push_back(std::move(t));
  return id;
}

std::unique_ptr<Graph> rebuilt(std::vector<Node> nodes, std::vector<ValueInfo> values, const Graph& like,
                               std::vector<int> outputs) {
  for (size_t i = 0; i < nodes.size(); ++i)
    for (size_t k = 0; k < nodes[i].outputs.size(); ++k) {
      values[nodes[i].outputs[k]].producer = static_cast<int>(i);
      values[nodes[i].outputs[k]].output_index = static_cast<int>(k);
    }
  auto g = std::make_unique<Graph>();
  g->reset_ids(std::move(nodes), std::move(values), like.inputs(), like.input_names(), std::move(outputs));
  g->verify();
  return g;
}

}  // namespace memory_pass

Tensor to_memory(const Tensor& x, MemoryKind kind, const std::string& group) {
  Attrs a{{"to", std::string(memory_kind_name(kind))}};
  if (!group.empty()) a.set("group", group);
  return emit1("transfer", {x}, std::move(a));
}

namespace memory_pass {

std::unique_ptr<Graph> split_host_updates(const Graph& g, const std::vector<char>& offloaded) {
  auto which = [&](size_t i) {
    const Node& n = g.nodes()[i];
    return n.prim->decompose &&
           std::any_of(n.inputs.begin(), n.inputs.end(), [&](int v) { return offloaded[v] != 0; });
  };
  bool any = false;
  for (size_t i = 0; i < g.nodes().size() && !any; ++i) any = which(i);
  if (!any) return nullptr;
  return replay(g, nullptr, [&](size_t i, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
    if (!which(i)) return std::nullopt;
    const Node& n = g.nodes()[i];
    return n.prim->decompose(ins, n.attrs);
  });
}

std::unique_ptr<Graph> offload_program(const Graph& g, const OffloadRewrite& r) {
  const size_t n_in = g.inputs().size();
  const std::vector<Node>& nodes = g.nodes();
  std::vector<ValueInfo> values = g.values();
  std::vector<std::string> group_of(values.size());
  for (size_t i = 0; i < n_in; ++i) {
    values[g.inputs()[i]].kind = r.in_kind.at(i);
    group_of[g.inputs()[i]] = r.group.at(i);
  }
  std::vector<Node> out;
  out.reserve(nodes.size() * 2);
  auto add_transfer = [&](int v, MemoryKind to, const NodeFacts& at, const std::string& group) {
    const int nv = memory_pass::add_transfer(out, values, v, to, at, group);
    group_of.push_back(group_of[v]);
    MemoryCategory& c = values[nv].category;
    if (c != MemoryCategory::params && c != MemoryCategory::optimizer_state) c = MemoryCategory::temporaries;
    return nv;
  };
  // Per value: its current copy on the other memory kind and the last node that read it.
  struct Copy {
    int value = -1, last_use = -1;
  };
  std::vector<Copy> fetched(values.size()), returned(values.size());
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    Node n = nodes[i];
    if (n.prim == prims::transfer()) {  // already placed (remat offload of saved residuals)
      values[n.outputs[0]].kind = parse_memory_kind(n.attrs.s("to"));
      out.push_back(std::move(n));
      continue;
    }
    // The update runs on the host with the optimizer state there; else only its nodes that read an
    // offloaded param (new = old - step) do, so a param is not fetched for its update and its new
    // value is computed where it lives.
    bool reads_host = false;
    for (int v : n.inputs) reads_host = reads_host || values[v].kind == MemoryKind::pinned_host;
    const MemoryKind where = r.update.at(i) && (r.host_update || reads_host) ? MemoryKind::pinned_host : MemoryKind::device;
    for (int& v : n.inputs) {
      if (values[v].kind == where) continue;
      if (where == MemoryKind::device) {
        Copy& c = fetched[v];
        if (c.value < 0 || i - c.last_use > kFetchReuseNodes)
          c.value = add_transfer(v, MemoryKind::device, n.facts, group_of[v]);
        c.last_use = i;
        v = c.value;
      } else {
        Copy& c = returned[v];
        if (c.value < 0) c.value = add_transfer(v, MemoryKind::pinned_host, n.facts, "");
        v = c.value;
      }
    }
    for (int v : n.outputs) values[v].kind = where;
    out.push_back(std::move(n));
  }
  // Outputs left where they must be (new params and state where the old ones live).
  std::vector<int> outputs = g.outputs();
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (k >= r.out_kind.size() || !r.out_kind[k]) continue;
    int& v = outputs[k];
    if (values[v].kind != *r.out_kind[k]) v = add_transfer(v, *r.out_kind[k], {StepPhase::update, -1}, "");
  }
  return rebuilt(std::move(out), std::move(values), g, std::move(outputs));
}

}  // namespace memory_pass

StepProgram offload_step(StepProgram p, const OffloadOptions& o) {
  const size_t n_in = p.graph->inputs().size();
  const std::vector<MemoryKind> state_kind = offloaded_state(o, p.paths, p.n_state);
  std::vector<MemoryKind> in_kind(n_in, MemoryKind::device);
  std::copy(state_kind.begin(), state_kind.end(), in_kind.begin());
  if (std::count(in_kind.begin(), in_kind.end(), MemoryKind::pinned_host) == 0) return p;
  // With the optimizer state on the device, an update that reads an offloaded param is split into
  // its elementwise parts: the ones that read the param (new = old - step) run on the host, the
  // moments stay on the device, and one array (the step) crosses instead of the gradient and both
  // moments there and back.
  if (!o.optimizer_state) {
    std::vector<char> offloaded(p.graph->values().size(), 0);
    for (size_t i = 0; i < p.n_params; ++i) offloaded[p.graph->inputs()[i]] = in_kind[i] == MemoryKind::pinned_host;
    if (std::unique_ptr<Graph> split = memory_pass::split_host_updates(*p.graph, offloaded)) p.graph = std::move(split);
  }
  const Graph& g = *p.graph;
  memory_pass::OffloadRewrite r;
  r.in_kind = in_kind;
  r.group.assign(n_in, "");
  for (size_t i = 0; i < p.n_params; ++i) r.group[i] = memory_pass::layer_of(p.paths[i]);
  for (size_t i = p.n_params; i < p.n_params + p.n_state; ++i) r.group[i] = g.input_names()[i];
  const std::vector<char> phase = memory_pass::phases(p);
  r.update.assign(phase.size(), 0);
  for (size_t i = 0; i < phase.size(); ++i) r.update[i] = phase[i] == 2;
  r.host_update = o.optimizer_state;
  r.out_kind.assign(g.outputs().size(), std::nullopt);
  for (size_t k = 3; k < g.outputs().size(); ++k) r.out_kind[k] = in_kind[k - 3];
  p.graph = memory_pass::offload_program(g, r);
  return p;
}

std::vector<MemoryKind> offloaded_state(const OffloadOptions& o, const std::vector<std::string>& paths, size_t n_state) {
  if (o.prefetch_depth < 0)
    throw UserError(fmt::format("[offload] prefetch_depth must be >= 0 (layers fetched ahead), got {}", o.prefetch_depth));
  std::vector<MemoryKind> kind(paths.size() + n_state, MemoryKind::device);
  for (const std::string& pat : o.params) {
    bool hit = false;
    for (size_t i = 0; i < paths.size(); ++i)
      if (glob_match(pat, paths[i])) {
        kind[i] = MemoryKind::pinned_host;
        hit = true;
      }
    if (!hit)
      throw UserError(fmt::format("[offload] the pattern '{}' matches no param; params are named like '{}'", pat,
                                  paths.empty() ? std::string("?") : paths.front()));
  }
  if (o.optimizer_state) std::fill(kind.begin() + static_cast<std::ptrdiff_t>(paths.size()), kind.end(), MemoryKind::pinned_host);
  return kind;
}

}  // namespace px
