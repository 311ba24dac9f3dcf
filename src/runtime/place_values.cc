// Where each value of a program lives: a transfer's target, else the host when the value is
// marked so (the offload pass) or all its operands live there; and, for a program whose values
// carry no category (a plain jit function), its caller's arrays counted as activations.
#include "ir/primitive.h"
#include "ops/prims.h"
#include "runtime/compile_passes.h"

namespace px {

void place_values(Graph& g) {
  for (const Node& n : g.nodes()) {
    MemoryKind k = MemoryKind::device;
    if (n.prim == prims::transfer()) {
      k = parse_memory_kind(n.attrs.s("to"));
    } else if (!n.inputs.empty()) {
      bool host = true;
      for (int v : n.inputs) host = host && g.values()[v].kind == MemoryKind::pinned_host;
      if (host) k = MemoryKind::pinned_host;
    }
    for (int v : n.outputs) {
      ValueInfo& info = g.mutable_value(v);
      if (n.prim == prims::transfer() || info.kind == MemoryKind::device) info.kind = k;
    }
  }
  for (const ValueInfo& info : g.values())
    if (info.category != MemoryCategory::temporaries) return;
  for (int v : g.inputs()) g.mutable_value(v).category = MemoryCategory::activations;
  for (int v : g.outputs()) g.mutable_value(v).category = MemoryCategory::activations;
}

}  // namespace px
