#include "backend/cuda/nvrtc.h"

#include <nvrtc.h>

#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "parallax/core.h"

namespace px::cuda {

namespace {

void check(nvrtcResult r, const char* what) {
  if (r != NVRTC_SUCCESS) throw Error(std::string("[cuda] NVRTC ") + what + " failed: " + nvrtcGetErrorString(r));
}

std::string program_log(nvrtcProgram p) {
  size_t size = 0;
  check(nvrtcGetProgramLogSize(p, &size), "nvrtcGetProgramLogSize");
  std::string log(size, '\0');
  if (size > 0) check(nvrtcGetProgramLog(p, log.data()), "nvrtcGetProgramLog");
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

Cubin compile_now(const KernelSource& k, int sm) {
  const char* headers[] = {element_math_text()};
  const char* names[] = {kElementMathInclude};
  nvrtcProgram prog = nullptr;
  check(nvrtcCreateProgram(&prog, k.source.c_str(), (k.name + ".cu").c_str(), 1, headers, names), "nvrtcCreateProgram");
  std::unique_ptr<nvrtcProgram, void (*)(nvrtcProgram*)> guard(&prog, [](nvrtcProgram* p) { nvrtcDestroyProgram(p); });
  const std::vector<std::string> opts = nvrtc_options(sm);
  std::vector<const char*> argv;
  for (const std::string& o : opts) argv.push_back(o.c_str());
  const nvrtcResult r = nvrtcCompileProgram(prog, static_cast<int>(argv.size()), argv.data());
  Cubin c;
  c.log = program_log(prog);
  if (r == NVRTC_ERROR_COMPILATION) return c;
  check(r, "nvrtcCompileProgram");
  size_t size = 0;
  check(nvrtcGetCUBINSize(prog, &size), "nvrtcGetCUBINSize");
  c.image.resize(size);
  check(nvrtcGetCUBIN(prog, c.image.data()), "nvrtcGetCUBIN");
  c.ok = true;
  return c;
}

}  // namespace

std::vector<std::string> nvrtc_options(int sm) {
  return {"--gpu-architecture=sm_" + std::to_string(sm),
          "--std=c++17",
          "--fmad=false",
          "--prec-div=true",
          "--prec-sqrt=true",
          "--ftz=false"};
}

Cubin compile_cubin(const KernelSource& kernel, int sm) {
  // The kernel's name carries its source's hash; the source is compared too, so that a collision
  // of the 64-bit hash can only cost a compile.
  static std::mutex m;
  static std::map<std::pair<std::string, int>, std::pair<std::string, Cubin>> cache;
  const auto key = std::make_pair(kernel.name, sm);
  {
    std::lock_guard<std::mutex> l(m);
    auto it = cache.find(key);
    if (it != cache.end() && it->second.first == kernel.source) return it->second.second;
  }
  Cubin c = compile_now(kernel, sm);
  if (c.ok) {
    std::lock_guard<std::mutex> l(m);
    cache[key] = {kernel.source, c};
  }
  return c;
}

std::string nvrtc_version() {
  int major = 0, minor = 0;
  check(nvrtcVersion(&major, &minor), "nvrtcVersion");
  return std::to_string(major) + "." + std::to_string(minor);
}

}  // namespace px::cuda
