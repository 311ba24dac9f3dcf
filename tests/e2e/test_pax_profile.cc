// PX_PROFILE=1 under pax train: the job dir gets the step's profile and its last step as a
// Chrome trace. (Its own binary: the environment is read once per process, so PX_PROFILE is set
// before any use.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "parallax/pax.h"

namespace px::pax {
namespace {

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(PaxProfile, TrainWritesTheProfileAndTheLastStepsTimeline) {
  ::setenv("PX_PROFILE", "1", 1);
  const std::string d = ::testing::TempDir() + "/pax_profile_" + std::to_string(::getpid());
  std::filesystem::remove_all(d);
  ExperimentConfig c = experiment("copy.TransformerLmTiny");
  for (const char* s :
       {"model.d_model=32", "model.d_ff=64", "model.n_layers=1", "model.seq_len=16", "data.batch=4",
        "schedule.warmup_steps=1", "train.steps=3", "train.eval_interval=0", "train.checkpoint_interval=0"})
    apply_override(c, s);
  std::ostringstream log;
  train(c, {.job_dir = d, .progress = false, .out = &log});
  const std::string profile = read(d + "/profile.txt");
  EXPECT_NE(profile.find("profile: 2 runs after the first"), std::string::npos) << profile;
  EXPECT_NE(profile.find("dot_general"), std::string::npos) << profile;
  const nlohmann::json trace = nlohmann::json::parse(read(d + "/timeline.json"));
  int kernels = 0;
  for (const auto& e : trace["traceEvents"]) kernels += e["ph"] == "X" && e["name"] == "dot_general";
  EXPECT_GT(kernels, 0);
  EXPECT_GT(trace["otherData"]["run_s"].get<double>(), 0.0);
  std::filesystem::remove_all(d);
}

}  // namespace
}  // namespace px::pax
