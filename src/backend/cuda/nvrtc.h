// Generated kernels compiled by NVRTC to cubin for one GPU architecture, cached by the source's
// hash and the architecture: in memory, and on disk in <user cache>/parallax/cuda-kernels/ (the
// cubins of a program are compiled once per machine, not once per process). Needs no GPU (NVRTC is a library): the CUDA
// backend loads the cubin with the driver API, and tests/backend/test_cuda_codegen.cc compiles every kernel the
// generator emits for sm_80 and sm_90.
#pragma once

#include <string>
#include <vector>

#include "backend/cuda/codegen.h"

namespace px::cuda {

struct Cubin {
  bool ok = false;
  std::string image;  // the cubin (an ELF image), empty when the compile failed
  std::string log;    // NVRTC's log (the errors when !ok)
};

// The options generated kernels are compiled with for compute capability `sm` (80 for sm_80):
// no contraction of multiply-adds (--fmad=false) and IEEE division and square roots, so that the
// element math gives the bits its CPU test checks (src/backend/element_math.h).
std::vector<std::string> nvrtc_options(int sm);

// Compiles (or finds in the caches) the kernel's source for sm_<sm>. A compile error is returned,
// not thrown (ok false, the log says why); an NVRTC failure of another kind throws px::Error.
// `disk` false: the on-disk cache is neither read nor written (the NVRTC test compiles everything).
Cubin compile_cubin(const KernelSource& kernel, int sm, bool disk = true);

// The file the on-disk cache keeps the kernel's cubin for sm_<sm> in: its name, the architecture
// and a hash of the source, the options and NVRTC's version ("" without a cache folder: neither
// XDG_CACHE_HOME nor HOME is set).
std::string cubin_cache_path(const KernelSource& kernel, int sm);

// NVRTC's version, "13.0".
std::string nvrtc_version();

}  // namespace px::cuda
