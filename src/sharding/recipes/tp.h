// The Megatron roles of a traced forward program's params, read from the graph: which weight is
// split by columns, which by rows, which table is vocab-parallel. TP and FSDP_TP apply them to
// every param; AUTO decides per group whether to apply them.
#pragma once

#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

struct TpRole {
  enum Kind { none, column, row, vocab, embedding } kind = none;
  int dim = -1;      // the dim split over the model axis
  std::string note;  // e.g. "column (feeds blocks.0.mlp.proj.w)"
  // Params that must be split together (a column weight, the row weights it feeds, its siblings
  // and biases) share a group: one param index of the group, the same for all of its params.
  int group = -1;
};

// One role per param; `forward`'s first inputs are the params, named by `paths`.
std::vector<TpRole> tp_roles(const Graph& forward, const std::vector<std::string>& paths);

// The dim a param of type `t` is stored split on over `n` devices (FSDP, FSDP_TP and AUTO's
// storage choice): the first that divides by n other than `skip` (its tensor-parallel dim, -1 for
// none), as the shards of a leading dim are contiguous and gathered and reduce-scattered without
// packing; -1 when none divides.
int storage_dim(const TensorType& t, int64_t n, int skip);

}  // namespace px
