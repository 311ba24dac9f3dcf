// CPU kernels of the index family. (Filled in by its owner.)
#include "backend/cpu/kernel.h"

namespace px::cpu {

void register_index_kernels() {}

}  // namespace px::cpu
