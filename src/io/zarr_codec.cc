// The chunk codec chain of checkpoint arrays: bytes (little endian, the host order) -> zstd ->
// crc32c (the Castagnoli CRC of the compressed bytes, appended little endian).
#include <zstd.h>

#include <bit>
#include <cstdio>
#include <cstring>

#include "io/crc32c.h"
#include "io/zarr.h"

namespace px::zarr {

static_assert(std::endian::native == std::endian::little, "Zarr chunks are written in the host's byte order");

namespace {

// A zstd skippable frame (magic 0x184D2A50..5F, u32 LE length, payload): decoders skip it, so the
// tag rides along without changing the chunk's values for Zarr readers.
constexpr uint32_t kTagMagic = 0x184D2A5A;

uint32_t le32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}
void put_le32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

}  // namespace

void encode_chunk(const void* data, size_t nbytes, int zstd_level, std::vector<char>& out, const std::string& tag) {
  size_t bound = ZSTD_compressBound(nbytes);
  const size_t tag_bytes = tag.empty() ? 0 : 8 + tag.size();
  out.resize(bound + tag_bytes + 4);
  size_t n = ZSTD_compress(out.data(), bound, data, nbytes, zstd_level);
  if (ZSTD_isError(n)) throw Error(std::string("[checkpoint] zstd compression failed: ") + ZSTD_getErrorName(n));
  if (!tag.empty()) {
    put_le32(out.data() + n, kTagMagic);
    put_le32(out.data() + n + 4, static_cast<uint32_t>(tag.size()));
    std::memcpy(out.data() + n + 8, tag.data(), tag.size());
    n += tag_bytes;
  }
  put_le32(out.data() + n, io::crc32c(out.data(), n));
  out.resize(n + 4);
}

std::string decode_chunk(const char* data, size_t size, void* out, size_t nbytes, std::string* tag) {
  if (tag) tag->clear();
  if (size < 4) return "truncated: " + std::to_string(size) + " bytes, shorter than its 4-byte checksum";
  const uint32_t stored = le32(data + size - 4);
  const uint32_t actual = io::crc32c(data, size - 4);
  if (stored != actual) {
    char buf[96];
    std::snprintf(buf, sizeof buf, "checksum mismatch (stored crc32c %08x, computed %08x over %zu bytes)", stored,
                  actual, size - 4);
    return std::string(buf) + ": the chunk file is corrupted or truncated";
  }
  size_t body = size - 4;
  const size_t frame = ZSTD_findFrameCompressedSize(data, body);
  if (ZSTD_isError(frame)) return "not a zstd frame";
  if (frame < body) {  // what follows the data frame can only be the tag
    const size_t rest = body - frame;
    const char* t = data + frame;
    if (rest < 8 || le32(t) != kTagMagic || le32(t + 4) != rest - 8)
      return "holds " + std::to_string(rest) + " bytes after its zstd frame that are not a chunk tag";
    if (tag) tag->assign(t + 8, rest - 8);
    body = frame;
  }
  unsigned long long content = ZSTD_getFrameContentSize(data, body);
  if (content == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
  if (content != ZSTD_CONTENTSIZE_UNKNOWN && content != nbytes)
    return "holds " + std::to_string(content) + " bytes, expected " + std::to_string(nbytes);
  size_t n = ZSTD_decompress(out, nbytes, data, body);
  if (ZSTD_isError(n)) return std::string("zstd decompression failed: ") + ZSTD_getErrorName(n);
  if (n != nbytes) return "decompresses to " + std::to_string(n) + " bytes, expected " + std::to_string(nbytes);
  return "";
}

int min_zstd_level() { return ZSTD_minCLevel(); }
int max_zstd_level() { return ZSTD_maxCLevel(); }

}  // namespace px::zarr
