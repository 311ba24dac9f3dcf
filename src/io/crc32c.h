// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of Zarr's crc32c codec and
// of TFRecord framing: the library's one implementation (SSE4.2 instructions when built for them).
//
//   uint32_t c = px::io::crc32c(data, n);
//   c = px::io::crc32c(more, m, c);  // continues over more bytes: the CRC of data then more
#pragma once

#include <cstddef>
#include <cstdint>

namespace px::io {

uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace px::io
