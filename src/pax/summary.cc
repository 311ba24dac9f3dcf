#include "pax/summary.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "parallax/core.h"

namespace px::pax {
namespace {

// CRC-32C (Castagnoli), reflected polynomial 0x82F63B78, one table lookup per byte.
const uint32_t* crc_table() {
  static uint32_t t[256] = {};
  static bool init = [] {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return true;
  }();
  (void)init;
  return t;
}

void put_varint(std::string& s, uint64_t v) {
  while (v >= 0x80) {
    s += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  s += static_cast<char>(v);
}
void put_tag(std::string& s, int field, int wire) { put_varint(s, static_cast<uint64_t>(field << 3 | wire)); }
template <class T>
void put_fixed(std::string& s, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));  // little-endian hosts only (x86-64, aarch64)
  s.append(b, sizeof(T));
}
void put_bytes(std::string& s, int field, const std::string& bytes) {
  put_tag(s, field, 2);
  put_varint(s, bytes.size());
  s += bytes;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Event{wall_time = 1 (double), step = 2 (int64), file_version = 3 (string), summary = 5}.
std::string event(double wall_time, int64_t step, const std::string* file_version, const std::string* summary) {
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  if (file_version) put_bytes(e, 3, *file_version);
  if (summary) put_bytes(e, 5, *summary);
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n) {
  const uint32_t* t = crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xffffffffu;
  for (size_t i = 0; i < n; ++i) c = t[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  gethostname(host, sizeof host - 1);
  const double t = now_s();
  path_ = dir + "/events.out.tfevents." + std::to_string(static_cast<int64_t>(t)) + "." + host + "." +
          std::to_string(getpid());
  f_ = std::fopen(path_.c_str(), "ab");
  if (!f_) throw Error("[pax] cannot write the summary file '" + path_ + "'");
  const std::string version = "brain.Event:2";
  record(event(t, 0, &version, nullptr));
  flush();
}

EventWriter::~EventWriter() {
  if (f_) std::fclose(f_);
}

void EventWriter::record(const std::string& payload) {
  std::string r;
  const uint64_t len = payload.size();
  put_fixed(r, len);
  put_fixed(r, masked_crc32c(&len, sizeof len));
  r += payload;
  put_fixed(r, masked_crc32c(payload.data(), payload.size()));
  std::fwrite(r.data(), 1, r.size(), f_);
}

void EventWriter::scalars(int64_t step, const std::map<std::string, double>& values, double wall_time) {
  // Summary{value = 1 (repeated Value{tag = 1, simple_value = 2 (float)})}.
  std::string summary;
  for (const auto& [tag, v] : values) {
    std::string val;
    put_bytes(val, 1, tag);
    put_tag(val, 2, 5);
    put_fixed(val, static_cast<float>(v));
    put_bytes(summary, 1, val);
  }
  record(event(wall_time >= 0 ? wall_time : now_s(), step, nullptr, &summary));
}

void EventWriter::flush() { std::fflush(f_); }

}  // namespace px::pax
