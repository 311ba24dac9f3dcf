// Primitives of the rng family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_rng_primitives() {}

}  // namespace px
