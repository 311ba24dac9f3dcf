// What the checkpoint writer and reader share (internal): directory names, the commit marker,
// which chunks this process writes or reads, and the metadata.json document.
//
//   DIR/checkpoint_00000100/          committed: renamed from checkpoint_00000100.tmp
//     COMMITTED                       the marker, written last (readers ignore dirs without it)
//     metadata.json                   step, config, data/RNG state, arrays and their shardings
//     zarr.json                       a Zarr v3 group over the arrays
//     <array name>/zarr.json          a Zarr v3 array; chunk grid = shard grid
//     <array name>/c/<i>/<j>          one chunk per distinct shard: zstd frame + tag + crc32c
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "parallax/checkpoint.h"

namespace px::ckpt {

inline constexpr const char* kMarker = "COMMITTED";
inline constexpr const char* kMetadata = "metadata.json";
inline constexpr const char* kTmpSuffix = ".tmp";
inline constexpr const char* kDeletingSuffix = ".deleting";
inline constexpr int kFormatVersion = 1;

std::string step_dir_name(int64_t step);  // "checkpoint_00000100"
// The step of "checkpoint_<digits>"; nullopt for any other name (temporary ones included).
std::optional<int64_t> parse_step_dir(const std::string& name);
bool is_committed(const std::string& checkpoint_dir);
std::vector<int64_t> committed_steps(const std::string& dir);  // ascending

// The mesh positions whose shards `process` holds (every position of a mesh in one process).
std::vector<int> local_positions(const Mesh& mesh, int process);

// One chunk per distinct shard: replicas of a shard share a chunk, written by the lowest mesh
// position holding it.
struct ChunkRef {
  std::vector<int64_t> index;  // chunk grid index
  std::vector<int64_t> offset;  // element offset in the global array
  int owner = 0;               // mesh position that writes it
};
std::vector<ChunkRef> distinct_chunks(const TensorType& type, const Sharding& s);
// The shard shape, with 0-sized dims as 1 (Zarr chunk dims are >= 1).
Shape chunk_shape(const TensorType& type, const Sharding& s);

// Throws px::Error when `name` cannot be a Zarr array name in a checkpoint.
void validate_array_name(const std::string& name);
std::string mesh_text(const Mesh& m);  // "data:4,model:2"; "" for a mesh without axes

// Every chunk file carries a tag naming its step, array, chunk key and (from version 2) dtype
// (zarr::encode_chunk), so a chunk moved from another array or position, left from another step,
// or read as another dtype of the same size (metadata.json and zarr.json edited alike) is refused
// on restore instead of restoring as other values. metadata.json's "chunk_tags" says which
// version the checkpoint's chunks have (absent in checkpoints written before: read unchecked).
inline constexpr int kChunkTagVersion = 2;
std::string chunk_tag(int64_t step, const std::string& array, const std::string& key, DType dtype,
                      int version = kChunkTagVersion);
// "chunk c/0/1 of array 'w' of step 100" for a tag (or what is odd about it), for messages.
std::string describe_chunk_tag(const std::string& tag);

std::string metadata_json(const Checkpoint& c);
// `chunk_tags`, when given, receives the metadata's "chunk_tags" (0 when absent).
CheckpointInfo parse_metadata(const std::string& text, const std::string& where, int64_t* chunk_tags = nullptr);
// The text of a JSON document, checked; throws naming `what` when it is not JSON.
std::string checked_json(const std::string& text, const std::string& what);

// Copies the box [src_begin, src_begin + extent) of a row-major array of shape src_shape into
// dst (shape dst_shape) at dst_begin. Element size in bytes.
void copy_box(const char* src, const Shape& src_shape, const std::vector<int64_t>& src_begin, char* dst,
              const Shape& dst_shape, const std::vector<int64_t>& dst_begin, const Shape& extent, int64_t elem);

}  // namespace px::ckpt
