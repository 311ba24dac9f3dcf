// The hardware peak MFU is taken against (runtime/fma_peak.h): MFU is the rate over the peak and
// never above 1 (a rate above the peak says so), bad figures are errors, and the peak is measured
// once per machine, cached with its date, and a re-measurement keeps the higher figures.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "runtime/fma_peak.h"

namespace fs = std::filesystem;

namespace {

TEST(Mfu, IsTheModelRateOverThePeak) {
  const px::Mfu half = px::model_flops_utilization(5e11, 1e12);
  EXPECT_DOUBLE_EQ(half.fraction, 0.5);
  EXPECT_FALSE(half.over_peak);
  const px::Mfu at = px::model_flops_utilization(1e12, 1e12);
  EXPECT_DOUBLE_EQ(at.fraction, 1.0);
  EXPECT_FALSE(at.over_peak);
  EXPECT_DOUBLE_EQ(px::model_flops_utilization(0, 1e12).fraction, 0.0);
}

TEST(Mfu, NeverAboveOneARateAboveThePeakSaysSo) {
  for (double rate : {1.0000001e12, 1.029e12, 5e12, 1e30}) {
    const px::Mfu m = px::model_flops_utilization(rate, 1e12);
    EXPECT_DOUBLE_EQ(m.fraction, 1.0) << rate;
    EXPECT_TRUE(m.over_peak) << rate;
  }
}

TEST(Mfu, ABadPeakOrRateIsAnError) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double peak : {0.0, -1e12, nan, inf}) {
    try {
      px::model_flops_utilization(1e9, peak);
      FAIL() << "peak " << peak << " was accepted";
    } catch (const px::Error& e) {
      EXPECT_NE(std::string(e.what()).find("the peak is"), std::string::npos) << e.what();
    }
  }
  for (double rate : {-1.0, nan, inf}) {
    try {
      px::model_flops_utilization(rate, 1e12);
      FAIL() << "rate " << rate << " was accepted";
    } catch (const px::Error& e) {
      EXPECT_NE(std::string(e.what()).find("model FLOP rate"), std::string::npos) << e.what();
    }
  }
}

// Each test's cache in a folder of its own ($XDG_CACHE_HOME, which hardware_peak reads).
class PeakCache : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/fma_peak_" + std::to_string(getpid()) + "_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    setenv("XDG_CACHE_HOME", dir_.c_str(), 1);
    unsetenv("PX_RECALIBRATE");
  }
  void TearDown() override {
    unsetenv("XDG_CACHE_HOME");
    fs::remove_all(dir_);
  }
  static nlohmann::json read(const std::string& path) {
    std::ifstream f(path);
    return nlohmann::json::parse(f);
  }
  static void write(const std::string& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(); }
  std::string dir_;
};

TEST_F(PeakCache, MeasuredOnceThenReadBackWithItsDate) {
  const std::string path = px::hardware_peak_cache_path();
  EXPECT_EQ(path.rfind(dir_ + "/parallax/fma_peak-", 0), 0u) << path;
  const px::HardwarePeak first = px::hardware_peak();
  if (first.isa.empty()) GTEST_SKIP() << "no AVX2 or AVX-512: no FMA loop";
  EXPECT_FALSE(first.from_cache);
  EXPECT_GT(first.f32_flops, 1e9);  // any x86 core with AVX2 does more than a GFLOP/s
  EXPECT_GE(first.bf16_flops, first.f32_flops);  // the bf16 units, or the f32 FMAs bf16 runs on
  EXPECT_EQ(first.cache, path);
  ASSERT_TRUE(fs::exists(path));
  EXPECT_EQ(read(path)["measured"], first.measured);
  EXPECT_EQ(first.measured.size(), 16u) << first.measured;  // YYYY-MM-DD HH:MM

  const px::HardwarePeak again = px::hardware_peak();
  EXPECT_TRUE(again.from_cache);
  EXPECT_EQ(again.f32_flops, first.f32_flops);
  EXPECT_EQ(again.bf16_flops, first.bf16_flops);
  EXPECT_EQ(again.measured, first.measured);
  const std::string line = again.describe(px::DType::f32);
  for (const std::string& part : {std::string("TFLOP/s f32"), std::string("FMA loop"), again.cpu,
                                  "measured " + again.measured, "cached in " + path})
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  EXPECT_NE(again.describe(px::DType::bf16).find("TFLOP/s bf16"), std::string::npos);
}

// A measurement is a lower bound (another process may have held the cores): re-measuring keeps
// the higher figure, so a peak measured too low is corrected, and one measured right stays.
TEST_F(PeakCache, AReMeasurementKeepsTheHigherFigure) {
  const std::string path = px::hardware_peak_cache_path();
  const px::HardwarePeak real = px::hardware_peak();
  if (real.isa.empty()) GTEST_SKIP() << "no AVX2 or AVX-512: no FMA loop";
  nlohmann::json j = read(path);
  j["f32_flops"] = 1e3;
  j["bf16_flops"] = 1e3;
  write(path, j);
  EXPECT_EQ(px::hardware_peak().f32_flops, 1e3);  // the cache is believed until a rate contradicts it
  const px::HardwarePeak fixed = px::hardware_peak(/*remeasure=*/true);
  EXPECT_GT(fixed.f32_flops, 1e9);
  EXPECT_GT(fixed.bf16_flops, 1e9);
  EXPECT_GT(read(path)["f32_flops"].get<double>(), 1e9);

  j["f32_flops"] = 1e18;
  write(path, j);
  setenv("PX_RECALIBRATE", "1", 1);  // the same as remeasure
  const px::HardwarePeak kept = px::hardware_peak();
  unsetenv("PX_RECALIBRATE");
  EXPECT_FALSE(kept.from_cache);
  EXPECT_EQ(kept.f32_flops, 1e18);
}

// Another machine's figures (another CPU model or count) and a damaged file are measured again.
TEST_F(PeakCache, AnotherMachinesOrADamagedCacheIsMeasuredAgain) {
  const std::string path = px::hardware_peak_cache_path();
  if (px::hardware_peak().isa.empty()) GTEST_SKIP() << "no AVX2 or AVX-512: no FMA loop";
  nlohmann::json j = read(path);
  for (auto [key, value] : {std::pair<const char*, nlohmann::json>{"cpu", "Some Other CPU"}, {"cpus", 4096}}) {
    nlohmann::json other = j;
    other[key] = value;
    other["f32_flops"] = 1e3;
    write(path, other);
    const px::HardwarePeak p = px::hardware_peak();
    EXPECT_FALSE(p.from_cache) << key;
    EXPECT_GT(p.f32_flops, 1e9) << key;
  }
  std::ofstream(path) << "{\"cpu\": ";  // cut short
  EXPECT_FALSE(px::hardware_peak().from_cache);
  EXPECT_TRUE(px::hardware_peak().from_cache);  // and written whole again
}

}  // namespace
