// Primitives of the reduce family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_reduce_primitives() {}

}  // namespace px
