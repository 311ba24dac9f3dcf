// CRC-32C, the checksum of Zarr chunks and TFRecord framing: standard check values, every
// length around the 8-byte stride, and continuing a CRC over more bytes.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "io/crc32c.h"

namespace px::io {
namespace {

// Bit by bit, straight from the definition.
uint32_t reference_crc32c(const std::string& s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(Crc32c, StandardCheckValues) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);  // the CRC-32C check value (RFC 3720)
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');  // RFC 3720 B.4
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
}

TEST(Crc32c, EveryLengthAndOffsetMatchesTheDefinition) {
  std::mt19937 rng(7);
  std::string bytes(100, '\0');
  for (char& b : bytes) b = static_cast<char>(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t n = 0; off + n <= bytes.size(); ++n) {
      std::string s = bytes.substr(off, n);
      ASSERT_EQ(crc32c(bytes.data() + off, n), reference_crc32c(s)) << "offset " << off << ", " << n << " bytes";
    }
}

TEST(Crc32c, ContinuesOverMoreBytes) {
  const std::string a = "the quick brown fox ", b = "jumps over the lazy dog";
  EXPECT_EQ(crc32c(b.data(), b.size(), crc32c(a.data(), a.size())), crc32c((a + b).data(), a.size() + b.size()));
}

}  // namespace
}  // namespace px::io
