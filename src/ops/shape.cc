// Primitives of the shape family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_shape_primitives() {}

}  // namespace px
