// TensorBoard event files written without TensorFlow: TFRecord framing (length, masked CRC32C,
// payload, masked CRC32C) around Event protos encoded by hand (wall_time, step, file_version,
// summary.value{tag, simple_value}, session_log{status}).
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

namespace px::pax {

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
  // SessionLog{status: START} at `step`: TensorBoard forgets the events it read before this one
  // (in this file or older ones of the dir) at steps >= `step`, i.e. a run that restarted there.
  void session_start(int64_t step, double wall_time = -1);
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& payload);
  std::string path_;
  std::FILE* f_ = nullptr;
};

// Rewrites the event files in `dir` without the events past `step` (those of a run that was killed
// after them and before its checkpoint; the resumed run writes them again), and cuts a file at a
// record torn by a kill. Returns the number of events dropped; files that keep all are untouched.
int64_t drop_events_after(const std::string& dir, int64_t step);

}  // namespace px::pax
