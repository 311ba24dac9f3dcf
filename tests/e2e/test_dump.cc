// PX_DUMP=DIR: a small FSDP step leaves one readable text file per compiler pass, in pass order.
// (Its own binary: the environment is read once per process, so PX_DUMP is set before any use.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../sharding/recipe_check.h"

namespace px {
namespace {

TEST(Dump, FsdpStepWritesEveryPass) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("px_dump_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  ::setenv("PX_DUMP", dir.c_str(), 1);
  recipe_check::Fixture f(recipe_check::gpt_micro());
  TrainStep step(
      f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
      {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::FSDP, .sharding = {.fsdp_min_bytes = 1024}});
  std::vector<std::string> files;
  for (auto& e : fs::directory_iterator(dir)) files.push_back(e.path().filename().string());
  std::sort(files.begin(), files.end());
  std::string names;
  for (auto& n : files) names += n + " ";
  const std::vector<std::string> passes = {"trace_autodiff", "sharding_decision", "annotate",   "partition",
                                           "optimize",       "schedule",          "buffer_plan"};
  size_t at = 0;
  for (const std::string& p : passes) {
    size_t found = names.find("_" + p + ".txt", at);
    EXPECT_NE(found, std::string::npos) << p << " missing or out of order in: " << names;
    if (found != std::string::npos) at = found;
  }
  auto read = [&](const std::string& pass) {
    for (auto& n : files)
      if (n.find("_" + pass + ".txt") != std::string::npos) {
        std::ifstream in(dir / n);
        std::stringstream ss;
        ss << in.rdbuf();
        return ss.str();
      }
    return std::string();
  };
  EXPECT_NE(read("trace_autodiff").find("# pass: trace_autodiff"), std::string::npos);
  EXPECT_NE(read("sharding_decision").find("(regather)"), std::string::npos);
  EXPECT_NE(read("partition").find("all_gather"), std::string::npos);
  EXPECT_NE(read("schedule").find("reduce_scatter.start"), std::string::npos);
  EXPECT_NE(read("buffer_plan").find("collective_buffers"), std::string::npos);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace px
