// pax train's MFU is taken against the hardware's peak (runtime/fma_peak.h): the run names the
// peak (value, dtype, how it was obtained) in its first lines, every MFU it prints is at most 100%,
// and metrics.jsonl keeps the MFU and the peak used. A cached peak below what the step does is
// measured again, and the run says so.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <vector>

#include "parallax/pax.h"
#include "runtime/fma_peak.h"

namespace fs = std::filesystem;

namespace px::pax {
namespace {

// The peak's cache in a folder of this process, not the user's ~/.cache.
const std::string kXdgCache = [] {
  const std::string d = ::testing::TempDir() + "/pax_mfu_" + std::to_string(::getpid()) + "_xdg";
  fs::remove_all(d);
  setenv("XDG_CACHE_HOME", d.c_str(), 1);
  return d;
}();

struct TrainRun {
  std::vector<std::string> lines;
  std::vector<nlohmann::json> train_metrics;
};

TrainRun train_tiny(const std::string& name) {
  const std::string d = ::testing::TempDir() + "/pax_mfu_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  ExperimentConfig c = experiment("copy.TransformerLmTiny");
  for (const char* s : {"model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.seq_len=16", "data.batch=4",
                        "schedule.warmup_steps=1", "train.steps=6", "train.summary_interval=2", "train.eval_interval=0",
                        "train.checkpoint_interval=0"})
    apply_override(c, s);
  std::ostringstream log;
  train(c, {.job_dir = d, .progress = false, .out = &log});
  TrainRun r;
  std::istringstream in(log.str());
  for (std::string l; std::getline(in, l);) r.lines.push_back(l);
  std::ifstream f(d + "/metrics.jsonl");
  for (std::string l; std::getline(f, l);)
    if (!l.empty() && nlohmann::json::parse(l)["split"] == "train") r.train_metrics.push_back(nlohmann::json::parse(l));
  fs::remove_all(d);
  return r;
}

// Every "MFU x%" of the train lines, in percent.
std::vector<double> printed_mfu(const TrainRun& r) {
  std::vector<double> out;
  const std::regex mfu(R"(MFU ([0-9.]+)%)");
  for (const std::string& l : r.lines) {
    std::smatch m;
    if (l.rfind("train step", 0) == 0 && std::regex_search(l, m, mfu)) out.push_back(std::stod(m[1]));
  }
  return out;
}

TEST(PaxMfu, TheFirstLinesNameThePeakAndMetricsKeepIt) {
  const TrainRun r = train_tiny("named");
  const HardwarePeak peak = hardware_peak();  // what the run measured and cached
  ASSERT_GE(r.lines.size(), 3u);
  EXPECT_EQ(r.lines[0].rfind("pax train copy.TransformerLmTiny", 0), 0u) << r.lines[0];
  const std::string& named = r.lines[1];
  EXPECT_EQ(named.rfind("MFU against the peak ", 0), 0u) << named;
  for (const std::string& part :
       {std::string("TFLOP/s f32"), std::string("FMA loop on "), peak.cpu, "measured " + peak.measured, peak.cache})
    EXPECT_NE(named.find(part), std::string::npos) << part << " not in: " << named;

  const std::vector<double> mfu = printed_mfu(r);
  ASSERT_EQ(mfu.size(), 3u);
  for (double m : mfu) EXPECT_LE(m, 100.0);
  ASSERT_EQ(r.train_metrics.size(), 3u);
  for (const nlohmann::json& m : r.train_metrics) {
    ASSERT_TRUE(m.contains("mfu") && m.contains("peak_flops")) << m.dump();
    EXPECT_EQ(m["peak_flops"].get<double>(), peak.f32_flops) << m.dump();
    EXPECT_GT(m["mfu"].get<double>(), 0.0);
    EXPECT_LE(m["mfu"].get<double>(), 1.0);
    // The model's FLOPs per step over the peak: the same ratio in every window.
    EXPECT_NEAR(m["mfu"].get<double>() / m["steps_per_sec"].get<double>(),
                r.train_metrics[0]["mfu"].get<double>() / r.train_metrics[0]["steps_per_sec"].get<double>(),
                1e-9 * r.train_metrics[0]["mfu"].get<double>() / r.train_metrics[0]["steps_per_sec"].get<double>());
  }
}

// A peak cached far too low (measured while other processes held the cores, say): the first rate
// above it makes the run measure again, say so, and go on against the new peak, never above 100%.
TEST(PaxMfu, ACachedPeakBelowTheRateIsMeasuredAgain) {
  const HardwarePeak real = hardware_peak();
  if (real.isa.empty()) GTEST_SKIP() << "no AVX2 or AVX-512: no FMA loop";
  nlohmann::json low;
  {
    std::ifstream f(real.cache);
    low = nlohmann::json::parse(f);
  }
  low["f32_flops"] = 1e3;
  std::ofstream(real.cache) << low.dump();
  const TrainRun r = train_tiny("low");
  EXPECT_NE(r.lines[1].find(" 1e-09 TFLOP/s f32"), std::string::npos) << r.lines[1];  // 1e3 FLOP/s, as cached
  bool said = false, remeasured = false;
  for (const std::string& l : r.lines) {
    said = said || (l.find("is above the peak of") != std::string::npos &&
                    l.find("measuring the peak again") != std::string::npos);
    remeasured = remeasured || (said && l.rfind("MFU against the peak ", 0) == 0 &&
                                l.find("kept in " + real.cache) != std::string::npos);
  }
  EXPECT_TRUE(said && remeasured);
  for (double m : printed_mfu(r)) EXPECT_LE(m, 100.0);
  for (const nlohmann::json& m : r.train_metrics) {
    EXPECT_LE(m["mfu"].get<double>(), 1.0) << m.dump();
    EXPECT_GT(m["peak_flops"].get<double>(), 1e9) << m.dump();  // the re-measured one
  }
  EXPECT_GT(hardware_peak().f32_flops, 1e9);  // and cached
}

}  // namespace
}  // namespace px::pax
