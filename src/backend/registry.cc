// Backends by platform: the built-in ones, registered on first use, and any a program adds; what
// a Backend does by default that is not a one-liner; primitive handles for backends out of tree.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <mutex>

#include "backend/ref/ref.h"
#include "core/box.h"
#include "core/env.h"
#include "ir/primitive.h"
#include "parallax/backend.h"
#include "parallax/core.h"

namespace px {

namespace {

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::function<Backend&()>>& registry() {
  static std::map<std::string, std::function<Backend&()>> r;
  return r;
}

std::map<std::string, std::function<std::string()>>& providers() {
  static std::map<std::string, std::function<std::string()>> p;
  return p;
}

void add(const std::string& platform, std::function<Backend&()> get) {
  if (!registry().emplace(platform, std::move(get)).second)
    throw Error("[backend] platform '" + platform + "' is registered twice");
}

// A platform's memory as its backend allocates, frees, copies and reaches it.
PlatformMemory memory_of(std::function<Backend&()> get) {
  PlatformMemory m;
  m.allocate = [get](const Placement& p, int64_t bytes) { return get().allocate(p, bytes); };
  m.free = [get](const Placement& p, void* ptr, int64_t bytes) { get().free(p, ptr, bytes); };
  m.copy = [get](void* dst, const void* src, int64_t bytes) { get().copy({CopyJob{dst, src, bytes}}).wait(); };
  m.host_visible = [get](const Placement& p) { return get().host_visible(p); };
  return m;
}

// The built-in backends' memory is theirs from the start (before any Array is made, which may be
// before any backend is looked up): registered while the library loads.
[[maybe_unused]] const bool builtin_memory_registered = [] {
  register_platform_memory("cpu", memory_of(cpu_backend));
  register_platform_memory("ref", memory_of(ref::backend));
  return true;
}();

// The built-in backends; the registry lock is held.
void register_builtins() {
  static bool done = false;
  if (std::exchange(done, true)) return;
  add("cpu", cpu_backend);
  add("ref", ref::backend);
}

}  // namespace

void register_backend(const std::string& platform, std::function<Backend&()> get) {
  if (!valid_platform_name(platform))
    throw Error("[backend] platform name '" + platform +
                "' is not valid: use lower-case letters, digits and '_', starting with a letter (as in PX_DEVICES)");
  if (!get) throw Error("[backend] platform '" + platform + "' registered without a backend");
  std::lock_guard<std::mutex> l(registry_mutex());
  register_builtins();
  if (registry().count(platform)) throw Error("[backend] platform '" + platform + "' is registered twice");
  register_platform_memory(platform, memory_of(get));
  add(platform, std::move(get));
}

bool has_backend(const std::string& platform) {
  std::lock_guard<std::mutex> l(registry_mutex());
  register_builtins();
  return registry().count(platform) != 0;
}

std::vector<std::string> backend_platforms() {
  std::lock_guard<std::mutex> l(registry_mutex());
  register_builtins();
  std::vector<std::string> names;
  for (const auto& [name, get] : registry()) names.push_back(name);
  return names;
}

void register_platform_provider(const std::string& platform, std::function<std::string()> provide) {
  if (!valid_platform_name(platform))
    throw Error("[backend] platform name '" + platform + "' is not valid: use lower-case letters, digits and '_'");
  if (!provide) throw Error("[backend] platform '" + platform + "' provided without a function");
  std::lock_guard<std::mutex> l(registry_mutex());
  providers()[platform] = std::move(provide);
}

namespace {

// Runs the provider of an unregistered platform (outside the lock: it registers the backend);
// "" when it is registered now, else why not ("" too when it has no provider).
std::string provide(const std::string& platform) {
  std::function<std::string()> p;
  {
    std::lock_guard<std::mutex> l(registry_mutex());
    register_builtins();
    if (registry().count(platform)) return "";
    auto it = providers().find(platform);
    if (it == providers().end()) return "";
    p = it->second;
  }
  return p();
}

}  // namespace

Backend& backend_for(const std::string& platform) {
  auto find = [&] {
    std::lock_guard<std::mutex> l(registry_mutex());
    register_builtins();
    auto it = registry().find(platform);
    return it != registry().end() ? it->second : std::function<Backend&()>();
  };
  std::function<Backend&()> get = find();
  std::string why;
  if (!get) {  // a provided platform registers now
    why = provide(platform);
    get = find();
  }
  if (!get)
    throw UserError(
        fmt::format("[backend] no backend for platform '{}'{}; the registered platforms are {} (e.g. "
                    "PX_DEVICES=cpu:2), and a backend of your own registers with px::register_backend",
                    platform, why.empty() ? "" : ": " + why, fmt::join(backend_platforms(), ", ")));
  return get();
}

namespace {

// A device set names a registered backend: "tpu:2" or "garbage" would make devices no backend
// runs. Throws px::UserError starting with `where` and the quoted `text`, naming the platforms.
void require_registered_platform(const std::string& platform, const std::string& text, const std::string& where) {
  if (has_backend(platform)) return;
  std::string why = provide(platform);
  if (has_backend(platform)) return;
  if (why.empty() && platform == "gpu") why = "NVIDIA GPUs are platform 'cuda'";
  if (why.empty() && platform == "cuda")
    why = "this program has no CUDA backend (built with -DPX_WITH_CUDA=ON, it is provided by "
          "px::cuda::provide_cuda_platform(), which pax calls)";
  throw UserError(fmt::format(
      "{}'{}': no backend is registered for platform '{}'{}; the registered platforms are {} (e.g. cpu:8 for 8 virtual "
      "CPU devices), and a backend of your own registers with px::register_backend before its devices are named",
      where, text, platform, why.empty() ? "" : " (" + why + ")", fmt::join(backend_platforms(), ", ")));
}

}  // namespace

// Here, not in core/memory.cc beside DeviceSet: the platforms they may name are this registry's.
DeviceSet parse_devices(const std::string& text) {
  auto [platform, count] = parse_device_text(text, "[devices] ");
  require_registered_platform(platform, text, "[devices] ");
  return DeviceSet{platform, count};
}

DeviceSet default_devices() {
  if (!env().devices_error.empty()) throw UserError(env().devices_error);
  // Checked here, not where PX_DEVICES is read: a program may register its backend after that.
  require_registered_platform(env().device_platform, env().device_text, "[env] PX_DEVICES=");
  return DeviceSet{env().device_platform, env().device_count};
}

const Primitive* primitive_handle(const std::string& name) { return &get_primitive(name); }

void Backend::copy_boxes(const std::vector<BoxCopy>& jobs) {
  for (const BoxCopy& j : jobs)
    copy_box(j.src, j.src_shape, j.src_offset.data(), j.dst, j.dst_shape, j.dst_offset.data(), j.extent,
             j.element_bytes);
}

}  // namespace px
