// The device groups of a local program's collective nodes on a mesh: what the runtime needs to
// compile (DeviceSetup::groups) or only plan (plan_program) a partitioned program.
#pragma once

#include <functional>

#include "parallax/sharding.h"
#include "runtime/collectives.h"

namespace px {

// Groups over the node's "axes" attribute (positions sharing every other coordinate); for
// collective_permute also its (source, target) pairs. The mesh is copied into the function.
std::function<CollectiveGroups(const Node&)> collective_groups(const Mesh& mesh);

}  // namespace px
