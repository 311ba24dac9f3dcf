// The CUDA backend (platform `cuda`): device memory from the CUDA runtime's stream-ordered pool,
// copies with cudaMemcpyAsync, and the generator's kernels (codegen.h) compiled by NVRTC for the
// device's architecture, loaded with cudaLibraryLoadData and launched on the device's stream.
//
// NEVER RUN: no GPU was available to this project when it was written. It builds with the CUDA
// toolkit and its test skips without a device (tests/backend/test_cuda_backend.cc); whether it
// works is for the first run on a GPU (issue 50's scripts/gpu_check.sh) to show.
//
// Matmuls run on cuBLASLt (matmul.h). Not yet: attention (cuDNN) and collectives (NCCL) have no
// kernels here, so a program with them fails to compile naming the primitive; allocations synchronize
// their stream (no caching allocator of our own over the pool yet); the backend registry does not
// register this backend by itself: register_cuda_backend() does, where a GPU is visible.
#pragma once

namespace px::cuda {

// The number of CUDA devices this process sees (0 without a driver or a device).
int visible_devices();

// Registers platform `cuda` (px::register_backend) when a device is visible and it is not
// registered yet; returns whether it is registered.
bool register_cuda_backend();

// Provides platform `cuda` (px::register_platform_provider): registered by register_cuda_backend
// when a program first names it, an error saying no device is visible where none is. Starts
// nothing until then.
void provide_cuda_platform();

}  // namespace px::cuda
