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

int add_transfer(std::vector<Node>& nodes, std::vector<ValueInfo>& values, int v, MemoryKind to,
                 const std::string& group) {
  Node t;
  t.prim = prims::transfer();
  t.attrs.set("to", std::string(memory_kind_name(to)));
  if (!group.empty()) t.attrs.set("group", group);
  t.inputs = {v};
  const int id = static_cast<int>(values.size());
  t.outputs = {id};
  values.push_back(values[v]);  // the same facts, but where it is sent
  values.back().kind = to;
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

namespace {

// The step traced again with every node `which` selects replaced by its primitive's
// decomposition; the values' facts, the gradients and the node ranges follow the values and nodes.
StepProgram decompose_nodes(StepProgram p, const std::function<bool(const Node&)>& which) {
  const Graph& g = *p.graph;
  if (std::none_of(g.nodes().begin(), g.nodes().end(), which)) return p;
  std::vector<int> start(g.nodes().size() + 1), new_id;
  std::unique_ptr<Graph> out =
      replay(g, &new_id, [&](size_t i, const std::vector<Tensor>& ins) -> std::optional<std::vector<Tensor>> {
        start[i] = static_cast<int>(current_graph()->nodes().size());
        const Node& n = g.nodes()[i];
        if (!which(n)) return std::nullopt;
        return n.prim->decompose(ins, n.attrs);
      });
  start[g.nodes().size()] = static_cast<int>(out->nodes().size());
  p.remap_grads([&](int v) { return new_id[v]; });
  p.remap_nodes(start);
  p.graph = std::move(out);
  return p;
}

}  // namespace

StepProgram offload_step(StepProgram p, const OffloadOptions& o) {
  const size_t n_in = p.graph->inputs().size();
  if (o.prefetch_depth < 0)
    throw UserError(fmt::format("[offload] prefetch_depth must be >= 0 (layers fetched ahead), got {}", o.prefetch_depth));
  std::vector<MemoryKind> in_kind(n_in, MemoryKind::device);
  bool any = false;
  for (size_t i = 0; i < p.n_params; ++i)
    for (const std::string& pat : o.params)
      if (glob_match(pat, p.paths[i])) {
        in_kind[i] = MemoryKind::pinned_host;
        any = true;
      }
  for (const std::string& pat : o.params) {
    bool hit = false;
    for (size_t i = 0; i < p.n_params && !hit; ++i) hit = glob_match(pat, p.paths[i]);
    if (!hit)
      throw UserError(fmt::format("[offload] the pattern '{}' matches no param; params are named like '{}'", pat,
                                  p.paths.empty() ? std::string("?") : p.paths.front()));
  }
  if (o.optimizer_state)
    for (size_t i = p.n_params; i < p.n_params + p.n_state; ++i) in_kind[i] = MemoryKind::pinned_host;
  any = any || (o.optimizer_state && p.n_state > 0);
  if (!any) return p;
  // With the optimizer state on the device, an update that reads an offloaded param is split into
  // its elementwise parts: the ones that read the param (new = old - step) run on the host, the
  // moments stay on the device, and one array (the step) crosses instead of the gradient and both
  // moments there and back.
  if (!o.optimizer_state) {
    std::vector<char> offloaded(p.graph->values().size(), 0);
    for (size_t i = 0; i < p.n_params; ++i) offloaded[p.graph->inputs()[i]] = in_kind[i] == MemoryKind::pinned_host;
    p = decompose_nodes(std::move(p), [offloaded](const Node& n) {
      return n.prim->decompose &&
             std::any_of(n.inputs.begin(), n.inputs.end(), [&](int v) { return offloaded[v] != 0; });
    });
  }
  const Graph& g = *p.graph;

  const std::vector<Node>& nodes = g.nodes();
  std::vector<ValueInfo> values = g.values();
  for (size_t i = 0; i < n_in; ++i) values[g.inputs()[i]].kind = in_kind[i];
  // The group (layer) of every value that is a param, for the fetches' prefetch groups.
  std::vector<std::string> group_of(values.size());
  for (size_t i = 0; i < p.n_params; ++i) group_of[g.inputs()[i]] = memory_pass::layer_of(p.paths[i]);
  for (size_t i = p.n_params; i < p.n_params + p.n_state; ++i) group_of[g.inputs()[i]] = g.input_names()[i];

  std::vector<Node> out;
  out.reserve(nodes.size() * 2);
  auto add_transfer = [&](int v, MemoryKind to, const std::string& group) {
    const int nv = memory_pass::add_transfer(out, values, v, to, group);
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
  std::vector<int> start(nodes.size() + 1);
  const bool host_update = o.optimizer_state;
  const std::vector<char> phase = memory_pass::phases(p);
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    Node n = nodes[i];
    start[i] = static_cast<int>(out.size());
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
    const MemoryKind where =
        phase[i] == 2 && (host_update || reads_host) ? MemoryKind::pinned_host : MemoryKind::device;
    for (int& v : n.inputs) {
      if (values[v].kind == where) continue;
      if (where == MemoryKind::device) {
        Copy& c = fetched[v];
        if (c.value < 0 || i - c.last_use > memory_pass::kFetchReuseNodes) c.value = add_transfer(v, MemoryKind::device, group_of[v]);
        c.last_use = i;
        v = c.value;
      } else {
        Copy& c = returned[v];
        if (c.value < 0) c.value = add_transfer(v, MemoryKind::pinned_host, "");
        v = c.value;
      }
    }
    for (int v : n.outputs) values[v].kind = where;
    out.push_back(std::move(n));
  }
  start[nodes.size()] = static_cast<int>(out.size());
  // New params and state go back where the old ones live (in place, between steps).
  std::vector<int> outputs = g.outputs();
  for (size_t k = 3; k < outputs.size(); ++k) {
    const MemoryKind want = in_kind[k - 3];
    int& v = outputs[k];
    if (values[v].kind != want) v = add_transfer(v, want, "");
  }
  p.graph = memory_pass::rebuilt(std::move(out), std::move(values), g, std::move(outputs));
  p.remap_nodes(start);
  return p;
}

}  // namespace px
