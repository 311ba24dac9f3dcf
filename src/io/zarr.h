// The parts of Zarr v3 that checkpoints use (internal): array metadata (zarr.json) with a regular
// chunk grid and the default "c/" chunk keys, and the codec chain bytes(little) -> zstd -> crc32c.
// bf16 is stored as Zarr's uint16 with attribute parallax.dtype = "bfloat16": Zarr v3 has no core
// bfloat16 type, and the same 16 bits as uint16 read back bit-exactly everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "parallax/core.h"

namespace px::zarr {

struct ArrayMeta {
  TensorType type;  // the px dtype; bf16 is written as uint16
  Shape chunk_shape;
  int zstd_level = 1;
  std::string attributes_json = "{}";  // a JSON object
};

// The Zarr v3 data type name of a px dtype ("float32", "uint16" for bf16, ...).
const char* data_type_name(DType d);
// The zarr.json text of an array.
std::string array_metadata(const ArrayMeta& m);
// Parses and checks a zarr.json written by array_metadata (regular grid, default keys, our codec
// chain). Throws px::Error("<where>: ...").
ArrayMeta parse_array_metadata(const std::string& text, const std::string& where);
// The zarr.json text of a group.
std::string group_metadata(const std::string& attributes_json = "{}");

// "c/1/0" for chunk index {1, 0}; "c" for a scalar.
std::string chunk_key(const std::vector<int64_t>& index);
// Number of chunks along each dim (chunk dims of 0 count as 1).
std::vector<int64_t> chunk_grid(const Shape& shape, const Shape& chunk_shape);

// Encodes a chunk's raw little-endian bytes: a zstd frame; then, when `tag` is given, a zstd
// skippable frame holding it (Zarr readers skip it; checkpoints bind a chunk to its array, chunk
// index and step with it); then the crc32c of all that (4 bytes LE).
void encode_chunk(const void* data, size_t nbytes, int zstd_level, std::vector<char>& out, const std::string& tag = "");
// Decodes into out (exactly `nbytes`); `tag` (when given) receives the chunk's tag, "" when it has
// none. Returns "" on success, else what is wrong ("checksum mismatch ...", "truncated ...") for
// the caller to name the array and chunk.
std::string decode_chunk(const char* data, size_t size, void* out, size_t nbytes, std::string* tag = nullptr);

// The compression levels zstd accepts (negative: faster, larger).
int min_zstd_level();
int max_zstd_level();

}  // namespace px::zarr
