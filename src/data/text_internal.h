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

// The default bound on one document's bytes (TextDataOptions::max_document_bytes).
inline constexpr int64_t kMaxDocumentBytes = int64_t{64} << 20;

// The files that `paths` name, in reading order ("gcide" stays as itself).
std::vector<std::filesystem::path> expand_paths(const std::vector<std::string>& paths);
// Appends the documents of one file until `out` holds `max_documents` (0: no limit). The file is
// read line by line; a document longer than `max_document_bytes` is an error naming the file and
// the line it starts on.
void read_file_documents(const std::filesystem::path& file, std::vector<std::string>& out, int64_t max_documents,
                         int64_t max_document_bytes = kMaxDocumentBytes);
// A compressed file may inflate to at most kMaxInflateRatio times its size, or `inflate_floor`
// bytes when that is more: text compresses about 3-10x, deflate at most about 1000x (a bomb).
inline constexpr uint64_t kMaxInflateRatio = 100;
inline constexpr uint64_t kInflateFloor = uint64_t{64} << 20;
// A file's bytes in pieces, inflated when it is gzip (other files are read as they are). Throws
// px::Error naming the file when it is not a regular file, is corrupt, or inflates past the bound
// above.
class GzReader {
 public:
  explicit GzReader(const std::string& path, uint64_t inflate_floor = kInflateFloor);
  ~GzReader();
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;
  size_t read(char* out, size_t n);  // up to n bytes; 0 at the end of the file

 private:
  void* f_ = nullptr;  // gzFile
  std::string path_;
  uint64_t floor_, stored_ = 0, bound_ = 0, inflated_ = 0;
};

// The bytes of a file, inflated when it is gzip (other files are read as they are), at most
// `limit` of them (0: all). Throws px::Error naming the file when it is not a regular file, is
// corrupt, or inflates past the bound above.
std::string read_maybe_gz(const std::string& path, size_t limit = 0, uint64_t inflate_floor = kInflateFloor);
// One GCIDE dictd entry as plain text: markup stripped, one paragraph per line.
std::string gcide_entry_text(std::string_view block);

// The token cache (cache_dir/tokens-<key>.bin): magic, document count, token count (u64 each),
// the document offsets (i64, count + 1) and the tokens (i32), in the host's byte order, then the
// crc32c (u32) of all the bytes before it: a file overwritten with other bytes of the same size
// is refused, not read as tokens. (Format 01 had no checksum; such a file is rebuilt.)
inline constexpr char kTokenMagic[8] = {'P', 'X', 'T', 'O', 'K', '0', '2', '\n'};

struct TokenizedCorpus {
  std::vector<int64_t> offsets{0};  // document d is tokens[offsets[d], offsets[d + 1])
  std::vector<int32_t> tokens;
  int64_t documents() const { return static_cast<int64_t>(offsets.size()) - 1; }
};

// Reads a token cache and checks all of it before it is used: the header against the file's
// size (before anything is allocated by it), the offsets (from 0, non-decreasing, ending at the
// token count), every token against the tokenizer's vocabulary [0, vocab_size) and the checksum
// of the whole. Returns false
// when the file does not exist; throws px::Error naming the file, the first fault and the fix.
bool read_token_cache(const std::filesystem::path& path, int64_t vocab_size, TokenizedCorpus& out);
// Writes a token cache (a temporary file renamed into place).
void write_token_cache(const std::filesystem::path& path, const TokenizedCorpus& c);

}  // namespace px::data
