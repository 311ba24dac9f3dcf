// Internals of the text data pipeline shared by its files and tests.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace px::data {

// SplitMix64's finalizer: a well-mixed 64-bit hash of x (seeds, shuffles, synthetic tokens).
inline uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The files that `paths` name, in reading order ("gcide" stays as itself).
std::vector<std::filesystem::path> expand_paths(const std::vector<std::string>& paths);
// Appends the documents of one file until `out` holds `max_documents` (0: no limit).
void read_file_documents(const std::filesystem::path& file, std::vector<std::string>& out, int64_t max_documents);
// A compressed file may inflate to at most kMaxInflateRatio times its size, or `inflate_floor`
// bytes when that is more: text compresses about 3-10x, deflate at most about 1000x (a bomb).
inline constexpr uint64_t kMaxInflateRatio = 100;
inline constexpr uint64_t kInflateFloor = uint64_t{64} << 20;
// The bytes of a file, inflated when it is gzip (other files are read as they are), at most
// `limit` of them (0: all). Throws px::Error naming the file when it is not a regular file, is
// corrupt, or inflates past the bound above.
std::string read_maybe_gz(const std::string& path, size_t limit = 0, uint64_t inflate_floor = kInflateFloor);
// One GCIDE dictd entry as plain text: markup stripped, one paragraph per line.
std::string gcide_entry_text(std::string_view block);

// The token cache (cache_dir/tokens-<key>.bin): magic, document count, token count (u64 each),
// the document offsets (i64, count + 1) and the tokens (i32), in the host's byte order.
inline constexpr char kTokenMagic[8] = {'P', 'X', 'T', 'O', 'K', '0', '1', '\n'};

struct TokenizedCorpus {
  std::vector<int64_t> offsets{0};  // document d is tokens[offsets[d], offsets[d + 1])
  std::vector<int32_t> tokens;
  int64_t documents() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// Reads a token cache and checks all of it before it is used: the header against the file's
// size (before anything is allocated by it), the offsets (from 0, non-decreasing, ending at the
// token count) and every token against the tokenizer's vocabulary [0, vocab_size). Returns false
// when the file does not exist; throws px::Error naming the file, the first fault and the fix.
bool read_token_cache(const std::filesystem::path& path, int64_t vocab_size, TokenizedCorpus& out);

}  // namespace px::data
