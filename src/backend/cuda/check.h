// The CUDA backend's check of a CUDA runtime call: a failure is a px::Error naming the call.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "parallax/core.h"

namespace px::cuda {

inline void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("[cuda] ") + what + " failed: " + cudaGetErrorString(e));
}

}  // namespace px::cuda
