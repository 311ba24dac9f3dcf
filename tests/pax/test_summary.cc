// The TensorBoard event writer: masked CRC32C, TFRecord framing, and the plot writer.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "parallax/core.h"
#include "pax/plot.h"
#include "pax/summary.h"

namespace px::pax {
namespace {

TEST(PaxSummary, MaskedCrc32cOfTheStandardCheckValue) {
  // CRC-32C("123456789") is 0xE3069283 (RFC 3720); masked: rotate right by 15, add 0xa282ead8.
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
  EXPECT_EQ(masked_crc32c("", 0), 0xA282EAD8u);
}

TEST(PaxSummary, EventFileIsFramedTfRecords) {
  const std::string dir = ::testing::TempDir() + "/pax_events";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    EventWriter w(dir);
    w.scalars(5, {{"loss", 1.5}, {"learning_rate", 1e-3}});
    path = w.path();
  }
  EXPECT_NE(path.find("/events.out.tfevents."), std::string::npos);
  std::ifstream f(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(f)), {});
  size_t pos = 0;
  int records = 0;
  while (pos < bytes.size()) {
    ASSERT_LE(pos + 12, bytes.size());
    uint64_t len;
    uint32_t len_crc, data_crc;
    std::memcpy(&len, bytes.data() + pos, 8);
    std::memcpy(&len_crc, bytes.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, masked_crc32c(bytes.data() + pos, 8));
    ASSERT_LE(pos + 12 + len + 4, bytes.size());
    std::memcpy(&data_crc, bytes.data() + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, masked_crc32c(bytes.data() + pos + 12, len));
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 2);  // file_version, then one event with both scalars
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("learning_rate"), std::string::npos);
}

// A resume drops the events past the checkpoint's step from the older files (and a record torn by
// a kill with everything after it), keeps the others byte for byte, and leaves whole files alone.
TEST(PaxSummary, DropEventsAfterKeepsTheStepsUpToTheResumedOne) {
  const std::string dir = ::testing::TempDir() + "/pax_events_drop";
  std::filesystem::remove_all(dir);
  std::string path;
  {
    EventWriter w(dir);
    for (int64_t s = 1; s <= 6; ++s) w.scalars(s, {{"loss", 1.0 / s}});
    path = w.path();
  }
  const auto whole = std::filesystem::file_size(path);
  EXPECT_EQ(drop_events_after(dir, 6), 0);
  EXPECT_EQ(std::filesystem::file_size(path), whole);
  EXPECT_EQ(drop_events_after(dir, 3), 3);
  const auto kept = std::filesystem::file_size(path);
  EXPECT_LT(kept, whole);
  EXPECT_EQ(drop_events_after(dir, 3), 0);
  {  // a record cut short, as a kill inside a write leaves it
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f.write("\x10\0\0\0\0\0", 6);
  }
  EXPECT_EQ(drop_events_after(dir, 3), 0);
  EXPECT_EQ(std::filesystem::file_size(path), kept);
  // A new writer after the resume: its START record at step 4 is a whole record like the others.
  EventWriter w(dir);
  w.session_start(4);
  w.flush();
  EXPECT_EQ(drop_events_after(dir, 4), 0);
  EXPECT_EQ(drop_events_after(dir, 3), 1);  // the START itself is at step 4
}

TEST(PaxPlot, WritesAPng) {
  const std::string path = ::testing::TempDir() + "/pax_plot.png";
  plot_png(path, "loss", "step", "loss", {{"train", {1, 2, 3}, {3, 2, 1.5}}, {"eval", {2}, {2.5}, 0xd62728, true}});
  std::ifstream f(path, std::ios::binary);
  char sig[8] = {};
  f.read(sig, 8);
  EXPECT_EQ(std::memcmp(sig, "\x89PNG\r\n\x1a\n", 8), 0);
  EXPECT_GT(std::filesystem::file_size(path), 2000u);
  EXPECT_THROW(plot_png("/nonexistent_dir/x.png", "t", "x", "y", {}), px::Error);
}

}  // namespace
}  // namespace px::pax
