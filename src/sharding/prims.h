// Primitives of the SPMD world: the sharding_constraint hint of traced programs, and the
// collectives and local_slice that the partitioner inserts into local (per-device) graphs.
//
// Attributes: `axes` names the mesh axes of the group ("data,model", first major); `group` is the
// group size; all_gather / reduce_scatter / local_slice act on `dim`; all_to_all splits
// `split_dim` and concatenates `concat_dim`; all_reduce / reduce_scatter have `reduce` ("sum",
// "max"); local_slice reads its group index from the device-coordinates input (i32[mesh rank])
// using `axis_ids` and `mesh` (the mesh axis sizes).
#pragma once

#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

// Registers the primitives above and their CPU kernels (local_slice, sharding_constraint); idempotent.
void ensure_sharding_registered();

std::string join_axes(const std::vector<std::string>& axes);  // "data,model"
std::vector<std::string> split_axes(const std::string& s);


// Typed handles to the primitives registered here (registering them on first use), for the
// sharding passes that recognise them (src/ops/prims.h has the others').
namespace prims {
const Primitive* sharding_constraint();
const Primitive* collective_permute();
}  // namespace prims

}  // namespace px
