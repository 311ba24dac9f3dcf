// The environment parser on arbitrary NAME=value lines: a px::Error or values in their ranges.
#include <cstdlib>
#include <map>
#include <string>

#include "core/env.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> vars;
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string::npos) nl = text.size();
    std::string line = text.substr(start, nl - start);
    size_t eq = line.find('=');
    if (eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
    start = nl + 1;
  }
  try {
    px::EnvConfig c = px::parse_env([&](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    });
    if (c.num_threads < 0 || c.device_count < 1 || c.device_count > 65536) std::abort();
    if (!c.devices_error.empty() && c.devices_error.find("PX_DEVICES") == std::string::npos) std::abort();
  } catch (const px::Error&) {
  }
  return 0;
}
