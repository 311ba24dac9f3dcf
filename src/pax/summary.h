// TensorBoard event files written without TensorFlow: TFRecord framing (length, masked CRC32C,
// payload, masked CRC32C) around Event protos encoded by hand (wall_time, step, file_version,
// summary.value{tag, simple_value}).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace px::pax {

uint32_t crc32c(const void* data, size_t n);
uint32_t masked_crc32c(const void* data, size_t n);  // TFRecord's ((crc >> 15 | crc << 17) + 0xa282ead8)

class EventWriter {
 public:
  // Creates dir and a new events.out.tfevents.<time>.<host> file in it; throws naming the path.
  explicit EventWriter(const std::string& dir);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;
  // One Event holding every scalar of the map at `step`.
  void scalars(int64_t step, const std::map<std::string, double>& values, double wall_time = -1);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace px::pax
