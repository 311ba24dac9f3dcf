// The AUTO search in a build without it (-DPX_WITH_AUTO=OFF; CMakeLists.txt compiles this file
// instead of solver.cc, the only user of CBC): every AUTO plan fails with what to rebuild. The
// cost model, the clusters and the recipes stay.
#include "sharding/auto/solver.h"

namespace px::autoshard {

AutoPlan solve(const Problem&) {
  throw UserError(
      "[auto] sharding strategy AUTO is not in this build of parallax (built with -DPX_WITH_AUTO=OFF); rebuild "
      "with -DPX_WITH_AUTO=ON (needs CBC: coinor-libcbc-dev), or choose a recipe: DDP, FSDP, TP or FSDP_TP");
}

}  // namespace px::autoshard

namespace px {

std::string AutoPlan::explain() const {
  return "AUTO is not in this build of parallax (-DPX_WITH_AUTO=OFF)\n";
}

}  // namespace px
