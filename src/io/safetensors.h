// The library's one reader of safetensors headers (internal): load_safetensors copies tensors out
// with it, and the memory-mapped reader of pretrained checkpoints (nn/pretrained) points into them.
//
//   io::SafetensorsHeader h = io::read_safetensors_header(path, file_size, read_at);
//   for (const io::SafetensorsTensor& t : h.tensors) use(t.name, t.dtype, h.data_offset + t.begin);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "parallax/core.h"

namespace px::io {

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // as the file names it: "F32", "BF16", "F64", "I64", "F8_E4M3", ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // its bytes [begin, end) within the data section
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;                     // where the data section starts: 8 + the header's length
  std::vector<SafetensorsTensor> tensors;       // in data order (header order among tensors at one offset)
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Reads `n` bytes at `offset` of the file into `dst`; false when the file ends first.
using ReadAt = std::function<bool(void* dst, size_t n, uint64_t offset)>;

// Reads and checks the header of the safetensors file `path` of `file_size` bytes: its length
// (inside the file, at most 100 MiB), strict JSON (no duplicate keys, valid UTF-8), an object
// whose "__metadata__" maps strings to strings and whose other members are exactly {dtype, shape,
// data_offsets} with a known dtype, non-negative dims and offsets [begin, end] inside the data
// section that span exactly the shape's bytes, tensors that do not overlap (gaps are allowed).
// Any problem throws px::IoError("<path>: <problem>").
SafetensorsHeader read_safetensors_header(const std::string& path, uint64_t file_size, const ReadAt& read);

// Bytes per element of a safetensors dtype name; 0 for a name the format does not define.
int64_t safetensors_dtype_bytes(const std::string& dtype);

}  // namespace px::io
