#include "backend/cuda/nvrtc.h"

#include <nvrtc.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "core/env.h"
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

namespace {

// The cubin of the on-disk cache at `path`, or an empty string when there is none.
std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return "";
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// Writes to a file of its own first and renames it into place, so that a reader (another process
// compiling the same kernel) never sees part of a cubin. A cache that cannot be written is skipped.
void write_file(const std::string& path, const std::string& bytes) {
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  const std::string tmp = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream f(tmp, std::ios::binary);
    if (!f) return;
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    if (!f) return;
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

}  // namespace

std::string cubin_cache_path(const KernelSource& kernel, int sm) {
  const std::string root = user_cache_dir();
  if (root.empty()) return "";
  std::string key = kernel.source + "\n" + nvrtc_version();
  for (const std::string& o : nvrtc_options(sm)) key += "\n" + o;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : key) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(h));
  return (std::filesystem::path(root) / "parallax" / "cuda-kernels" /
          (kernel.name + "-sm" + std::to_string(sm) + "-" + hash + ".cubin"))
      .string();
}

namespace {

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Cubin compile_cubin(const KernelSource& kernel, int sm, bool disk) {
  // The kernel's name carries its source's hash; the source is compared too, so that a collision
  // of the 64-bit hash can only cost a compile.
  static std::map<std::pair<std::string, int>, std::pair<std::string, Cubin>> cache;
  const auto key = std::make_pair(kernel.name, sm);
  {
    std::lock_guard<std::mutex> l(cache_mutex());
    auto it = cache.find(key);
    if (it != cache.end() && it->second.first == kernel.source) return it->second.second;
  }
  const std::string path = disk ? cubin_cache_path(kernel, sm) : "";
  Cubin c;
  if (!path.empty()) c.image = read_file(path);
  if (!c.image.empty()) {
    c.ok = true;
  } else {
    c = compile_now(kernel, sm);
    if (c.ok && !path.empty()) write_file(path, c.image);
  }
  if (c.ok) {
    std::lock_guard<std::mutex> l(cache_mutex());
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
