// The checkpoint readers on arbitrary bytes: a Zarr v3 array's zarr.json, a chunk (zstd frame, an
// optional tag frame, crc32c) decoded into a buffer of a given size, and a checkpoint's
// metadata.json. The first byte picks the reader; the rest is its input.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/layout.h"
#include "io/zarr.h"
#include "parallax/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int which = data[0] % 3;
  const char* rest = reinterpret_cast<const char*>(data + 2);
  const size_t n = size - 2;
  try {
    if (which == 0) {
      px::zarr::ArrayMeta m = px::zarr::parse_array_metadata(std::string(rest, n), "fuzz");
      if (m.type.rank() != static_cast<int>(m.chunk_shape.size())) std::abort();
      // What parses must print back to the same metadata.
      px::zarr::ArrayMeta again = px::zarr::parse_array_metadata(px::zarr::array_metadata(m), "again");
      if (again.type != m.type || again.chunk_shape != m.chunk_shape) std::abort();
    } else if (which == 1) {
      std::vector<char> out(data[1]);
      std::string tag;
      std::string err = px::zarr::decode_chunk(rest, n, out.data(), out.size(), &tag);
      if (err.empty()) {  // a chunk that decodes must encode back to one that decodes the same, tag included
        std::vector<char> enc, back(out.size());
        std::string tag_back;
        px::zarr::encode_chunk(out.data(), out.size(), 1, enc, tag);
        if (!px::zarr::decode_chunk(enc.data(), enc.size(), back.data(), back.size(), &tag_back).empty() ||
            back != out || tag_back != tag)
          std::abort();
        (void)px::ckpt::describe_chunk_tag(tag);
      }
    } else {
      px::CheckpointInfo info = px::ckpt::parse_metadata(std::string(rest, n), "fuzz");
      if (info.step < 0) std::abort();
    }
  } catch (const px::Error&) {
  }
  return 0;
}
