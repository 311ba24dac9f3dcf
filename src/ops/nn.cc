// Primitives of the nn family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_nn_primitives() {}

}  // namespace px
