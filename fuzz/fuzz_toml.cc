// The pax experiment config reader (toml++, the field table and the registry) on arbitrary TOML
// bytes: a px::Error naming the problem, or a config whose written TOML reads back to the same
// config. (The relations between fields, pax::validate, are checked by code of the model and
// optimizer that this build leaves out; tests/pax covers them.)
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "parallax/pax.h"

namespace {

void write_file(const std::string& path, const char* data, size_t size) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(data, static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/px_fuzz_toml_" + std::to_string(getpid()) + ".toml";
  write_file(path, reinterpret_cast<const char*>(data), size);
  px::pax::ExperimentConfig c;
  try {
    // A file naming its experiment resolves it from the registry; else it overrides the defaults.
    c = px::pax::from_toml_file(path);
  } catch (const px::Error&) {
    try {
      c = px::pax::ExperimentConfig();
      px::pax::apply_toml_file(c, path);
    } catch (const px::Error&) {
      return 0;
    }
  }
  // Accepted: every field holds an allowed value, so the config writes and reads back unchanged.
  const std::string text = px::pax::to_toml(c);
  write_file(path, text.data(), text.size());
  px::pax::ExperimentConfig back;
  back.name = c.name;
  back.summary = c.summary;
  try {
    px::pax::apply_toml_file(back, path);
  } catch (const px::Error& e) {
    std::fprintf(stderr, "an accepted config does not read back: %s\n%s", e.what(), text.c_str());
    std::abort();
  }
  if (px::pax::to_toml(back) != text) {
    std::fprintf(stderr, "an accepted config reads back different:\n%s", text.c_str());
    std::abort();
  }
  return 0;
}
