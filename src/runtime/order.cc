#include "runtime/order.h"

#include <algorithm>
#include <functional>

namespace px {

namespace {
bool is_gradient(const Graph& g, int v) { return g.values()[v].category == MemoryCategory::gradients; }
}  // namespace

std::unique_ptr<Graph> update_as_gradients_complete(const Graph& g) {
  const auto& nodes = g.nodes();
  const auto& values = g.values();
  const int n = static_cast<int>(nodes.size());
  std::vector<int> producer(values.size(), -1);  // from the nodes (a pass may leave ValueInfo::producer stale)
  for (int i = 0; i < n; ++i)
    for (int v : nodes[i].outputs) producer[v] = i;
  // Nodes that lead to a gradient (the backward pass; a gradient may also be read on the way to
  // another one, e.g. a bias's gradient that is a view of the layer's output gradient).
  std::vector<char> to_grad(n, 0), needed(values.size(), 0);
  for (size_t v = 0; v < values.size(); ++v) needed[v] = is_gradient(g, static_cast<int>(v));
  for (int i = n - 1; i >= 0; --i) {
    for (int v : nodes[i].outputs) to_grad[i] = to_grad[i] || needed[v];
    if (to_grad[i])
      for (int v : nodes[i].inputs) needed[v] = 1;
  }
  // R: the nodes that read a gradient or a value computed from one (in graph order, a topological
  // one), and lead to no gradient.
  std::vector<char> in_r(n, 0), from_grad(values.size(), 0);
  bool any = false;
  for (int i = 0; i < n; ++i) {
    for (int v : nodes[i].inputs) in_r[i] = in_r[i] || from_grad[v] || is_gradient(g, v);
    in_r[i] = in_r[i] && !to_grad[i];
    if (in_r[i])
      for (int v : nodes[i].outputs) from_grad[v] = 1;
    any = any || in_r[i];
  }
  if (!any) return nullptr;
  std::vector<std::vector<int>> users(values.size());
  for (int i = 0; i < n; ++i)
    for (int v : nodes[i].inputs) users[v].push_back(i);
  // Helpers: nodes outside R that lead to no gradient, read only by R nodes or helpers (at least one reader). They are
  // pulled in just before the first R node that needs them.
  std::vector<char> helper(n, 0);
  for (int i = n - 1; i >= 0; --i) {
    if (in_r[i] || to_grad[i]) continue;
    bool read = false, only = true;
    for (int v : nodes[i].outputs)
      for (int u : users[v]) {
        read = true;
        only = only && (in_r[u] || helper[u]);
      }
    helper[i] = read && only;
  }
  // Each R node is ready after the last node outside R and the helpers that it depends on; a
  // helper's readiness is that of its own operands. Slot k: after the k-th kept node (-1: first).
  std::vector<int> slot_of_kept(n, -1), ready(n, -1);
  int kept = 0;
  for (int i = 0; i < n; ++i)
    if (!in_r[i] && !helper[i]) slot_of_kept[i] = kept++;
  for (int i = 0; i < n; ++i) {
    if (!in_r[i] && !helper[i]) continue;
    int r = -1;
    for (int v : nodes[i].inputs) {
      int p = producer[v];
      if (p >= 0) r = std::max(r, in_r[p] || helper[p] ? ready[p] : slot_of_kept[p]);
    }
    ready[i] = r;
  }
  // An R node whose results (other than graph outputs, which live in the caller's arrays) are
  // larger than the gradient-derived values it reads waits for its first reader in R: with
  // skip_nonfinite, an update whose new params and state are selected only once the norm is known
  // runs then, instead of holding them from its gradient on. Every other R node runs when ready.
  std::vector<char> is_output(values.size(), 0);
  for (int v : g.outputs()) is_output[v] = 1;
  std::vector<int> slot = ready;
  for (int i = n - 1; i >= 0; --i) {
    if (!in_r[i]) continue;
    int64_t made = 0, read = 0;
    for (int v : nodes[i].outputs)
      if (!is_output[v]) made += g.type(v).nbytes();
    for (int v : nodes[i].inputs)
      if (from_grad[v] || is_gradient(g, v)) read += g.type(v).nbytes();
    if (made <= read) continue;
    int first = -1;
    for (int v : nodes[i].outputs)
      for (int u : users[v])
        if (in_r[u]) first = first < 0 ? slot[u] : std::min(first, slot[u]);
    if (first >= 0) slot[i] = std::max(ready[i], first);
  }
  std::vector<std::vector<int>> at_slot(kept + 1);  // R nodes placed after kept node k - 1
  for (int i = 0; i < n; ++i)
    if (in_r[i]) at_slot[slot[i] + 1].push_back(i);
  std::vector<int> order;
  order.reserve(n);
  std::vector<char> done(n, 0);
  std::function<void(int)> emit = [&](int i) {
    if (done[i]) return;
    done[i] = 1;
    for (int v : nodes[i].inputs)
      if (int p = producer[v]; p >= 0 && !done[p]) emit(p);  // helpers only: the rest is emitted
    order.push_back(i);
  };
  // The R nodes of one slot, each followed at once by its readers in R that it made ready (depth
  // first), so that a value is consumed before the next is made: with clipping, each clipped
  // gradient goes to its update before the next gradient is scaled.
  std::function<void(int, int)> emit_r = [&](int i, int at) {
    if (done[i]) return;
    emit(i);
    for (int v : nodes[i].outputs)
      for (int u : users[v]) {
        if (!in_r[u] || done[u] || slot[u] + 1 > at) continue;
        bool ok = true;
        for (int w : nodes[u].inputs)
          if (int p = producer[w]; p >= 0 && in_r[p] && !done[p]) ok = false;
        if (ok) emit_r(u, at);
      }
  };
  for (int i : at_slot[0]) emit_r(i, 0);
  for (int i = 0; i < n; ++i) {
    if (in_r[i] || helper[i]) continue;
    emit(i);
    for (int r : at_slot[slot_of_kept[i] + 1]) emit_r(r, slot_of_kept[i] + 1);
  }
  for (int i = 0; i < n; ++i) emit(i);  // nothing is left; kept for safety
  bool same = true;
  for (int i = 0; i < n && same; ++i) same = order[i] == i;
  if (same) return nullptr;
  std::vector<Node> new_nodes;
  new_nodes.reserve(n);
  std::vector<ValueInfo> new_values = values;
  for (int i : order) {
    for (int v : nodes[i].outputs) new_values[v].producer = static_cast<int>(new_nodes.size());
    new_nodes.push_back(nodes[i]);
  }
  auto out = std::make_unique<Graph>();
  out->reset_ids(std::move(new_nodes), std::move(new_values), g.inputs(), g.input_names(), g.outputs());
  return out;
}

std::vector<char> forward_nodes(const Graph& g) {
  const auto& nodes = g.nodes();
  const int n = static_cast<int>(nodes.size());
  std::vector<char> from_grad(g.values().size(), 0);
  bool any = false;
  for (size_t v = 0; v < from_grad.size(); ++v) {
    from_grad[v] = is_gradient(g, static_cast<int>(v));
    any = any || from_grad[v];
  }
  if (!any) return {};
  std::vector<int> producer(g.values().size(), -1);
  for (int i = 0; i < n; ++i) {
    for (int v : nodes[i].outputs) producer[v] = i;
    bool f = false;
    for (int v : nodes[i].inputs) f = f || from_grad[v];
    if (f)
      for (int v : nodes[i].outputs) from_grad[v] = 1;
  }
  std::vector<char> fwd(n, 0), needed(g.values().size(), 0);
  for (int v : g.outputs()) needed[v] = !from_grad[v];
  for (int i = n - 1; i >= 0; --i) {
    for (int v : nodes[i].outputs) fwd[i] = fwd[i] || needed[v];
    if (fwd[i])
      for (int v : nodes[i].inputs) needed[v] = 1;
  }
  return fwd;
}

}  // namespace px
