// Device sets ("cpu:8", from PX_DEVICES or a string) and meshes made over all of their devices.
#include <charconv>
#include <limits>

#include "core/env.h"
#include "parallax/sharding.h"

namespace px {
namespace {

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n"), e = s.find_last_not_of(" \t\r\n");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// "{data: 4, model: -1}": the axes as the user gave them, for messages.
std::string axes_text(const std::vector<std::pair<std::string, int64_t>>& axes) {
  std::string s = "{";
  for (size_t i = 0; i < axes.size(); ++i) s += (i ? ", " : "") + axes[i].first + ": " + std::to_string(axes[i].second);
  return s + "}";
}

std::string devices_text(int64_t n) { return std::to_string(n) + (n == 1 ? " device" : " devices"); }

}  // namespace

Mesh Mesh::create(const std::vector<std::pair<std::string, int64_t>>& axes, const DeviceSet& devices) {
  if (devices.count < 1)
    throw Error("[mesh] " + devices.to_string() + " has no devices; use cpu:N with N >= 1 (e.g. PX_DEVICES=cpu:8)");
  const std::string what = axes_text(axes);
  int rest = -1;  // the axis that takes the remaining devices
  int64_t known = 1;
  bool overflow = false;
  for (size_t i = 0; i < axes.size(); ++i) {
    const auto& [name, size] = axes[i];
    if (size == -1) {
      if (rest >= 0)
        throw Error("[mesh] " + what + ": axes '" + axes[rest].first + "' and '" + name +
                    "' both have size -1; at most one axis can take the remaining devices");
      rest = static_cast<int>(i);
      continue;
    }
    if (size < 1)
      throw Error("[mesh] " + what + ": axis '" + name + "' has size " + std::to_string(size) +
                  "; sizes are >= 1, or -1 for the remaining devices");
    overflow = overflow || __builtin_mul_overflow(known, size, &known);
  }
  if (overflow) throw Error("[mesh] " + what + " needs more devices than fit in 64 bits; use smaller axis sizes");
  std::vector<MeshAxis> resolved;
  for (const auto& [name, size] : axes) resolved.push_back({name, size, Link{}});
  if (rest >= 0) {
    if (devices.count % known != 0)
      throw Error("[mesh] " + what + ": the other axes need a multiple of " + devices_text(known) + " but " +
                  devices.to_string() + " has " + std::to_string(devices.count) + "; set PX_DEVICES=cpu:N with N a " +
                  "multiple of " + std::to_string(known) + " or change the axis sizes");
    resolved[rest].size = devices.count / known;
  } else if (known != devices.count) {
    throw Error("[mesh] " + what + " needs " + devices_text(known) + " but " + devices.to_string() + " has " +
                std::to_string(devices.count) + "; set PX_DEVICES=cpu:" + std::to_string(known) +
                " or change the axis sizes");
  }
  Mesh mesh(std::move(resolved), {}, devices.platform);
  return devices.processes == 1 ? mesh : mesh.with_processes(devices.processes);
}

Mesh Mesh::parse(const std::string& text, const DeviceSet& devices) {
  const std::string form =
      "write name:size pairs separated by commas, e.g. data:4,model:2 (size -1: the remaining devices)";
  std::string body = trim(text);
  const bool open = !body.empty() && body.front() == '{', close = !body.empty() && body.back() == '}';
  if (open != close || (open && body.size() < 2))
    throw UserError("[mesh] the mesh '" + text + "' has " +
                    (open ? "'{' without its closing '}'" : "'}' without its opening '{'") + "; " + form +
                    " (braces around all of it are optional)");
  if (open) body = trim(body.substr(1, body.size() - 2));
  if (body.empty()) throw Error("[mesh] the mesh text '" + text + "' is empty; " + form);
  std::vector<std::pair<std::string, int64_t>> axes;
  size_t start = 0;
  while (start <= body.size()) {
    size_t comma = body.find(',', start);
    if (comma == std::string::npos) comma = body.size();
    std::string token = trim(body.substr(start, comma - start));
    size_t colon = token.find(':');
    std::string name = trim(token.substr(0, colon));
    std::string size = colon == std::string::npos ? "" : trim(token.substr(colon + 1));
    int64_t n = 0;
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), n);
    if (name.empty() || size.empty() || ec != std::errc() || end != size.data() + size.size())
      throw Error("[mesh] cannot parse '" + token + "' in the mesh '" + text + "'; " + form);
    axes.emplace_back(name, n);
    start = comma + 1;
  }
  return create(axes, devices);
}

}  // namespace px
