// A read-only, memory-mapped safetensors file: the header is parsed and checked against the file
// size, and tensors are read straight from the mapping (no copy of the whole file).
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "parallax/core.h"

namespace px::nn::detail {

struct MappedTensor {
  std::string dtype;  // safetensors dtype: "F32", "BF16", "F16", "F64", ...
  Shape shape;
  const std::byte* data = nullptr;
  uint64_t nbytes = 0;
  int64_t numel() const;
};

class MappedSafetensors {
 public:
  // Maps `path` and validates its header (io::read_safetensors_header): throws
  // px::IoError("<path>: <problem>; <fix>") when the file is missing, truncated or malformed.
  explicit MappedSafetensors(const std::string& path);
  ~MappedSafetensors();
  MappedSafetensors(const MappedSafetensors&) = delete;
  MappedSafetensors& operator=(const MappedSafetensors&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return size_; }
  const std::map<std::string, MappedTensor>& tensors() const { return tensors_; }
  const MappedTensor* find(const std::string& name) const;

 private:
  std::string path_;
  void* base_ = nullptr;
  uint64_t size_ = 0;
  std::map<std::string, MappedTensor> tensors_;
};

// Element i of raw little-endian data as a float.
inline float read_f32(const std::byte* p, int64_t i) {
  float v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}
inline float read_f64(const std::byte* p, int64_t i) {
  double v;
  std::memcpy(&v, p + 8 * i, 8);
  return static_cast<float>(v);
}
inline float read_bf16(const std::byte* p, int64_t i) {
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}
float read_f16(const std::byte* p, int64_t i);

using ElementReader = float (*)(const std::byte* data, int64_t i);
// The reader of t's dtype (F32, BF16, F16, F64); throws px::Error naming the file for others.
ElementReader element_reader(const MappedTensor& t, const std::string& file, const std::string& name);

}  // namespace px::nn::detail
