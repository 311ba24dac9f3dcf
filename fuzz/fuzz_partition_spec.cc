// PartitionSpec::parse on arbitrary text: a px::Error, or a spec that prints and parses back to itself.
#include <cstdlib>
#include <string>

#include "parallax/sharding.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  px::PartitionSpec spec;
  try {
    spec = px::PartitionSpec::parse(text);
  } catch (const px::Error&) {
    return 0;
  }
  std::string printed = spec.to_string();
  try {
    if (!(px::PartitionSpec::parse(printed) == spec)) std::abort();
  } catch (const px::Error&) {
    std::abort();  // what parse accepted must print as text parse accepts
  }
  return 0;
}
