// CPU kernels of the rng family. (Filled in by its owner.)
#include "backend/cpu/kernel.h"

namespace px::cpu {

void register_rng_kernels() {}

}  // namespace px::cpu
