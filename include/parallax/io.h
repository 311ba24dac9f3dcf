// Reading and writing tensors in the safetensors format, which Python tools (safetensors,
// torch, numpy) read directly.
//
//   px::save_safetensors("model.safetensors", {"w", "b"}, {w, b}, {{"step", "100"}});
//   px::SafetensorsFile f = px::load_safetensors("model.safetensors");
//   const px::Array& w2 = f.get("w");          // bit-exact copy of w
//   std::string step = f.metadata.at("step");
#pragma once

#include <map>
#include <string>
#include <vector>

#include "parallax/core.h"

namespace px {

struct SafetensorsFile {
  std::vector<std::string> names;               // in the order of their data in the file
  std::vector<Array> arrays;                    // arrays[i] is names[i]
  std::map<std::string, std::string> metadata;  // the "__metadata__" map (may be empty)

  // The array called `name`; throws px::Error listing the names when absent.
  const Array& get(const std::string& name) const;
  bool contains(const std::string& name) const;
};

// Writes the arrays under the given names (unique, non-empty, valid UTF-8, not "__metadata__")
// with data in the given order. The file appears atomically: a temporary file in the same
// folder is written, flushed to disk and renamed over `path`. Throws px::UserError for bad names
// and px::IoError when writing fails, naming the file.
void save_safetensors(const std::string& path, const std::vector<std::string>& names, const std::vector<Array>& arrays,
                      const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file. Supported dtypes: F32, BF16, F16, I32, BOOL. Any problem
// (truncation, bad JSON, unknown dtype, offsets out of range or overlapping, a shape that does
// not match its byte size) throws px::IoError("<path>: <problem>").
SafetensorsFile load_safetensors(const std::string& path);

// The safetensors dtype string of a px dtype ("F32", "BF16", "F16", "I32", "BOOL").
const char* safetensors_dtype(DType d);

}  // namespace px
