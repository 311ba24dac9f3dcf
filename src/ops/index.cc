// Primitives of the index family. (Filled in by its owner.)
#include "ir/primitive.h"

namespace px {

void register_index_primitives() {}

}  // namespace px
