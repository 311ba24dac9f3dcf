// What compile knows of each value: the memory kind, category and layer the caller gave for the
// source graph's values (CompileOptions), carried to the simplified graph; memory kinds of the
// values computed by the program follow their operands.
#include "ir/primitive.h"
#include "runtime/compile_passes.h"
#include "ops/prims.h"

namespace px {

ValueFacts value_facts(const Graph& src, const Graph& g, const std::vector<int>& value_of, const CompileOptions& opt) {
  for (size_t given : {opt.value_categories.size(), opt.value_kinds.size(), opt.value_layers.size()})
    if (given && given != src.values().size())
      throw Error("[compile] value_categories, value_kinds and value_layers need one entry per value of the graph (" +
                  std::to_string(src.values().size()) + "), got " + std::to_string(given));
  const size_t nv = g.values().size();
  ValueFacts f;
  // Memory kinds: as given, else a transfer's target, else host when every operand is on the host.
  std::vector<signed char> given_kind(nv, -1);
  for (size_t v = 0; v < opt.value_kinds.size(); ++v)
    if (int w = value_of[v]; w >= 0) given_kind[w] = static_cast<signed char>(opt.value_kinds[v]);
  f.kind.assign(nv, MemoryKind::device);
  for (int v : g.inputs())
    if (given_kind[v] >= 0) f.kind[v] = static_cast<MemoryKind>(given_kind[v]);
  for (const Node& n : g.nodes()) {
    const bool transfer = n.prim == prims::transfer();
    MemoryKind k = MemoryKind::device;
    if (transfer) {
      k = parse_memory_kind(n.attrs.s("to"));
    } else if (!n.inputs.empty()) {
      bool host = true;
      for (int v : n.inputs) host = host && f.kind[v] == MemoryKind::pinned_host;
      if (host) k = MemoryKind::pinned_host;
    }
    for (int v : n.outputs) f.kind[v] = !transfer && given_kind[v] >= 0 ? static_cast<MemoryKind>(given_kind[v]) : k;
  }
  // Categories: as given; without them the caller's arrays count as activations, the rest as temporaries.
  f.category.assign(nv, MemoryCategory::temporaries);
  if (!opt.value_categories.empty()) {
    for (size_t v = 0; v < src.values().size(); ++v)
      if (int w = value_of[v]; w >= 0) f.category[w] = opt.value_categories[v];
  } else {
    for (int v : g.inputs()) f.category[v] = MemoryCategory::activations;
    for (int v : g.outputs()) f.category[v] = MemoryCategory::activations;
  }
  f.layer.resize(nv);
  for (size_t v = 0; v < opt.value_layers.size(); ++v)
    if (int w = value_of[v]; w >= 0) f.layer[w] = opt.value_layers[v];
  return f;
}

}  // namespace px
