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

void add(const std::string& platform, std::function<Backend&()> get) {
  if (!registry().emplace(platform, std::move(get)).second)
    throw Error("[backend] platform '" + platform + "' is registered twice");
}

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
  register_platform_memory(platform,
                           {[get](const Placement& p, int64_t bytes) { return get().allocate(p, bytes); },
                            [get](const Placement& p, void* ptr, int64_t bytes) { get().free(p, ptr, bytes); }});
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

Backend& backend_for(const std::string& platform) {
  std::function<Backend&()> get;
  {
    std::lock_guard<std::mutex> l(registry_mutex());
    register_builtins();
    auto it = registry().find(platform);
    if (it != registry().end()) get = it->second;
  }
  if (!get)
    throw UserError(
        fmt::format("[backend] no backend for platform '{}'; the registered platforms are {} (e.g. "
                    "PX_DEVICES=cpu:2), and a backend of your own registers with px::register_backend",
                    platform, fmt::join(backend_platforms(), ", ")));
  return get();
}

// parse_devices and default_devices (core) check platforms against this registry.
[[maybe_unused]] const bool g_platforms_listed = (set_platform_lister(&backend_platforms), true);

const Primitive* primitive_handle(const std::string& name) { return &get_primitive(name); }

void Backend::copy_boxes(const std::vector<BoxCopy>& jobs) {
  for (const BoxCopy& j : jobs)
    copy_box(j.src, j.src_shape, j.src_offset.data(), j.dst, j.dst_shape, j.dst_offset.data(), j.extent,
             j.element_bytes);
}

}  // namespace px
