// Primitives of the matmul family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_matmul_primitives() {}

}  // namespace px
