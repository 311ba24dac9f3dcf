// Which layer each value of a training step belongs to: for prefetch groups (offload) and for the
// memory report's largest users. A layer is a param path up to its block number ("blocks.3").
#include <algorithm>
#include <climits>
#include <map>
#include <string>
#include <vector>

#include "memory/rewrite.h"
#include "memory/step_program.h"

namespace px::memory_pass {

std::string layer_of(const std::string& path) {
  size_t start = 0;
  while (start <= path.size()) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string::npos)
      return path.substr(0, dot == std::string::npos ? path.size() : dot);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  const size_t last = path.rfind('.');
  return last == std::string::npos ? path : path.substr(0, last);
}

std::vector<char> phases(const StepProgram& p) {
  const Graph& g = *p.graph;
  const auto& nodes = g.nodes();
  std::vector<char> phase(nodes.size(), 2);
  auto mark = [&](std::vector<char> needed, char ph) {
    for (int i = static_cast<int>(nodes.size()) - 1; i >= 0; --i) {
      bool need = false;
      for (int v : nodes[i].outputs) need = need || needed[v];
      if (!need) continue;
      if (phase[i] == 2) phase[i] = ph;
      for (int v : nodes[i].inputs) needed[v] = 1;
    }
  };
  std::vector<char> loss(g.values().size(), 0), grads(g.values().size(), 0);
  bool any_grad = false;
  loss[g.outputs().at(0)] = 1;
  for (size_t v = 0; v < grads.size(); ++v)
    if (g.values()[v].category == MemoryCategory::gradients) grads[v] = 1, any_grad = true;
  if (!any_grad) {  // no gradient (a step without params): the nodes' facts
    for (size_t i = 0; i < nodes.size(); ++i)
      phase[i] = nodes[i].facts.phase == StepPhase::forward ? 0 : nodes[i].facts.phase == StepPhase::backward ? 1 : 2;
    return phase;
  }
  mark(loss, 0);
  mark(grads, 1);
  return phase;
}

void label_layers(StepProgram& p) {
  Graph& g = *p.graph;
  const size_t nv = g.values().size();
  // Layers are ranked in the order their params are declared (embedding, blocks, head).
  std::vector<std::string> names;
  std::map<std::string, int> rank_of, rank_of_param;
  std::vector<int> rank(nv, -1);
  for (size_t i = 0; i < p.n_params && i < g.inputs().size(); ++i) {
    const std::string layer = layer_of(p.paths[i]);
    auto [it, added] = rank_of.emplace(layer, static_cast<int>(names.size()));
    if (added) names.push_back(layer);
    rank[g.inputs()[i]] = rank_of_param[p.paths[i]] = it->second;
  }
  // Optimizer state is named "<param path>.<slot>".
  for (size_t i = p.n_params; i < p.n_params + p.n_state && i < g.input_names().size(); ++i) {
    const std::string& name = g.input_names()[i];
    auto it = rank_of_param.find(name.substr(0, name.rfind('.')));
    if (it != rank_of_param.end()) rank[g.inputs()[i]] = it->second;
  }
  // Forward: a value belongs to the deepest layer it depends on. Backward: to the deepest layer of
  // the forward values and params it reads, else (a gradient computed from gradients alone) to the
  // shallowest layer of those, as gradients flow from the head down. Update: to its param's layer
  // (the shallowest, as the clipping scale depends on every layer).
  const std::vector<char> phase = phases(p);
  std::vector<char> backward(nv, 0);
  const auto& nodes = g.nodes();
  for (size_t i = 0; i < nodes.size(); ++i) {
    int deepest = -1, shallowest = INT_MAX, shallowest_grad = INT_MAX;
    for (int v : nodes[i].inputs) {
      if (rank[v] < 0) continue;
      if (backward[v])
        shallowest_grad = std::min(shallowest_grad, rank[v]);
      else
        deepest = std::max(deepest, rank[v]);
      shallowest = std::min(shallowest, rank[v]);
    }
    int r = deepest;
    if (phase[i] == 1 && deepest < 0) r = shallowest_grad == INT_MAX ? -1 : shallowest_grad;
    if (phase[i] == 2) r = shallowest == INT_MAX ? -1 : shallowest;
    for (int v : nodes[i].outputs) {
      rank[v] = r;
      backward[v] = phase[i] == 1;
    }
  }
  // The new params and optimizer state (outputs 3, 4, ...) belong where the old ones do.
  const size_t n_io = std::min(g.inputs().size(), g.outputs().size() >= 3 ? g.outputs().size() - 3 : size_t{0});
  for (size_t i = 0; i < p.n_params + p.n_state && i < n_io; ++i) rank[g.outputs()[3 + i]] = rank[g.inputs()[i]];
  for (size_t v = 0; v < nv; ++v) g.mutable_value(static_cast<int>(v)).layer = rank[v] >= 0 ? names[rank[v]] : "";
}

}  // namespace px::memory_pass
