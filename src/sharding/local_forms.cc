// The partitioner's side of local forms: a node whose positional factor is split is emitted by its
// primitive's SpmdTraits::local_form (written beside the primitive in src/ops/, see
// src/ops/local_form.h) instead of as itself.
#include "sharding/spmd_internal.h"

namespace px::spmd {

bool needs_local_form(const Node& n, const ShardingRule& r, const FactorAxes& fa) {
  for (int f : positional_factors(*n.prim, r, n.attrs))
    if (!fa[f].empty()) return true;
  return false;
}

std::vector<Tensor> local_form(const LocalContext& c, const Node& n, const Graph& g, const ShardingRule& r,
                               const FactorAxes& fa, const std::vector<Tensor>& in,
                               const std::vector<TensorType>& want) {
  if (!n.prim->spmd.local_form)
    throw Error("[partition] primitive '" + n.prim->name +
                "' declares positional factors but no local form (SpmdTraits::local_form) to emit its split");
  TraceScope scope(&c.local);
  return n.prim->spmd.local_form(c, LocalFormArgs{n, g, r, fa, in, want});
}

}  // namespace px::spmd
