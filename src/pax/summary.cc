#include "pax/summary.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "io/crc32c.h"
#include "parallax/core.h"

namespace px::pax {
namespace {

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

// SessionLog{status = 1 (enum: START = 1)} as Event.session_log = 7.
std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_tag(log, 1, 0);
  put_varint(log, 1);
  std::string e;
  put_tag(e, 1, 1);
  put_fixed(e, wall_time);
  put_tag(e, 2, 0);
  put_varint(e, static_cast<uint64_t>(step));
  put_bytes(e, 7, log);
  return e;
}

bool get_varint(const std::string& s, size_t& i, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && i < s.size(); shift += 7) {
    const auto b = static_cast<uint8_t>(s[i++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// The step of an Event (field 2; 0 when absent); nullopt when the bytes are not a message.
std::optional<int64_t> event_step(const std::string& e) {
  int64_t step = 0;
  for (size_t i = 0; i < e.size();) {
    uint64_t key = 0, v = 0;
    if (!get_varint(e, i, key)) return std::nullopt;
    switch (key & 7) {
      case 0:
        if (!get_varint(e, i, v)) return std::nullopt;
        if (key >> 3 == 2) step = static_cast<int64_t>(v);
        break;
      case 1:
        i += 8;
        break;
      case 2:
        if (!get_varint(e, i, v) || v > e.size() - i) return std::nullopt;
        i += v;
        break;
      case 5:
        i += 4;
        break;
      default:
        return std::nullopt;
    }
    if (i > e.size()) return std::nullopt;
  }
  return step;
}

}  // namespace

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = io::crc32c(data, n);
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

void EventWriter::session_start(int64_t step, double wall_time) {
  record(session_start_event(wall_time >= 0 ? wall_time : now_s(), step));
}

void EventWriter::flush() { std::fflush(f_); }

int64_t drop_events_after(const std::string& dir, int64_t step) {
  namespace fs = std::filesystem;
  int64_t dropped = 0;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("events.out.tfevents.", 0) != 0 || !entry.is_regular_file(ec)) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::ostringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    std::string kept;
    int64_t here = 0;
    bool cut = false;
    for (size_t i = 0; i < text.size();) {
      uint64_t len = 0;
      uint32_t len_crc = 0, data_crc = 0;
      if (text.size() - i < 12) {
        cut = true;
        break;
      }
      std::memcpy(&len, text.data() + i, 8);
      std::memcpy(&len_crc, text.data() + i + 8, 4);
      if (len_crc != masked_crc32c(&len, 8) || len > text.size() - i - 16) {
        cut = true;  // a record torn by a kill: the rest of the file is not readable
        break;
      }
      const std::string payload = text.substr(i + 12, len);
      std::memcpy(&data_crc, text.data() + i + 12 + len, 4);
      const size_t next = i + 16 + len;
      std::optional<int64_t> s =
          data_crc == masked_crc32c(payload.data(), payload.size()) ? event_step(payload) : std::nullopt;
      if (!s) {
        cut = true;
        break;
      }
      if (*s > step)
        ++here;
      else
        kept.append(text, i, next - i);
      i = next;
    }
    if (here == 0 && !cut) continue;
    dropped += here;
    const std::string tmp = entry.path().string() + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << kept;
      if (!out) throw Error("[pax] cannot rewrite the summary file '" + entry.path().string() + "'");
    }
    fs::rename(tmp, entry.path(), ec);
    if (ec) throw Error("[pax] cannot rewrite the summary file '" + entry.path().string() + "': " + ec.message());
  }
  return dropped;
}

}  // namespace px::pax
