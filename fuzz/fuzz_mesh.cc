// The device-set parser (parse_device_text, what parse_devices and PX_DEVICES read before the
// registry checks the platform) and Mesh::parse on arbitrary text (first line: the device set, the
// rest: the mesh): a px::Error, or a mesh whose axes hold exactly the devices.
#include <cstdlib>
#include <string>

#include "core/env.h"
#include "parallax/sharding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  size_t nl = text.find('\n');
  std::string dev = nl == std::string::npos ? "cpu:8" : text.substr(0, nl);
  std::string mesh = nl == std::string::npos ? text : text.substr(nl + 1);
  px::DeviceSet devices{"cpu", 8};
  try {
    auto [platform, count] = px::parse_device_text(dev, "[devices] ");
    devices = px::DeviceSet{platform, count};
    if (devices.count < 1 || devices.count > 65536) std::abort();
  } catch (const px::Error&) {
  }
  try {
    px::Mesh m = px::Mesh::parse(mesh, devices);
    int64_t n = 1;
    for (const auto& a : m.axes()) n *= a.size;
    if (n != devices.count || m.size() != n) std::abort();
    // Axis names are names: nothing of the text's syntax ('{', ':', ',', spaces) ends up in one.
    for (const auto& a : m.axes())
      if (a.name.find_first_of("{}:, \t") != std::string::npos) std::abort();
  } catch (const px::Error&) {
  }
  return 0;
}
