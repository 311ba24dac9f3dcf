// PX_DUMP=DIR: every training step leaves one readable text file per pass of the pipeline, named
// after its program and numbered in pipeline order, the same list on one device, under a recipe
// and under AUTO; the candidates AUTO costs stay out of it (they go to DIR/candidates/ only with
// PX_DUMP_CANDIDATES=1). (Its own binary: the environment is read once per process, so PX_DUMP is
// set before any use.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "../sharding/recipe_check.h"

namespace px {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> files_in(const fs::path& dir, const std::string& prefix) {
  std::vector<std::string> files;
  if (!fs::exists(dir)) return files;
  for (auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (e.is_regular_file() && n.rfind(prefix, 0) == 0) files.push_back(n);
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The pipeline of a training step, in order (no autocast: f32).
std::vector<std::string> step_files(const std::string& program) {
  std::vector<std::string> out;
  const char* passes[] = {"trace_autodiff", "remat",    "sharding_decision", "annotate",   "partition",
                          "offload",        "optimize", "schedule",          "buffer_plan"};
  int n = 0;
  for (const char* p : passes) {
    char number[8];
    std::snprintf(number, sizeof number, "%02d", n++);
    out.push_back(program + "." + number + "." + p + ".txt");
  }
  return out;
}

TEST(Dump, EveryStepWritesItsPipelineInOrder) {
  const fs::path base = fs::temp_directory_path() / ("px_dump_" + std::to_string(::getpid()));
  const fs::path dir = base / "dump";  // not made here: the first dump makes it, parents included
  fs::remove_all(base);
  ::setenv("PX_DUMP", dir.c_str(), 1);
  ::unsetenv("PX_DUMP_CANDIDATES");
  recipe_check::Fixture f(recipe_check::gpt_micro());

  // One device: the same passes as on a mesh (the decision replicates everything, no collective).
  TrainStep one(f.model.store(), recipe_check::opt(), f.loss, f.batch_types);
  EXPECT_EQ(files_in(dir, "train_step."), step_files("train_step"));
  EXPECT_NE(read(dir / "train_step.00.trace_autodiff.txt").find("# pass: trace_autodiff"), std::string::npos);
  EXPECT_EQ(read(dir / "train_step.04.partition.txt").find("all_reduce"), std::string::npos);
  // What the passes decide about a value travels on the program and shows in each dump after it:
  // what it holds (from the trace on), which param's gradient it is, and its layer (from offload
  // on); about a node, its phase and microbatch (from the trace on, through partition).
  const std::string traced = read(dir / "train_step.00.trace_autodiff.txt");
  for (const char* fact : {"{params}", "{optimizer_state}", "{gradients, gradient of input 0}", "{activations}",
                           "# forward 0\n", "# backward 0\n", "# update\n"})
    EXPECT_NE(traced.find(fact), std::string::npos) << fact;
  const std::string local = read(dir / "train_step.05.offload.txt");
  for (const char* fact : {"# forward 0\n", "# backward 0\n", "# update\n"})
    EXPECT_NE(local.find(fact), std::string::npos) << fact;
  EXPECT_NE(local.find("{params, blocks.0} \"blocks.0."), std::string::npos);
  EXPECT_NE(local.find("{gradients, blocks.1}"), std::string::npos);

  // DDP over two devices: the gradients' all-reduces appear at partition and in the schedule.
  TrainStep ddp(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::DDP});
  EXPECT_EQ(files_in(dir, "train_step_2."), step_files("train_step_2"));
  EXPECT_NE(read(dir / "train_step_2.04.partition.txt").find("all_reduce"), std::string::npos);
  EXPECT_NE(read(dir / "train_step_2.07.schedule.txt").find("all_reduce.start"), std::string::npos);

  // FSDP: ZeRO-3's second gather for the backward pass shows in the decision.
  TrainStep fsdp(
      f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
      {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::FSDP, .sharding = {.fsdp_min_bytes = 1024}});
  EXPECT_EQ(files_in(dir, "train_step_3."), step_files("train_step_3"));
  EXPECT_NE(read(dir / "train_step_3.02.sharding_decision.txt").find("(regather)"), std::string::npos);
  EXPECT_NE(read(dir / "train_step_3.08.buffer_plan.txt").find("collective_buffers"), std::string::npos);

  // AUTO: the plans the solver costs are not dumped beside the pipeline, nor anywhere without
  // PX_DUMP_CANDIDATES.
  ShardingOptions o;
  o.auto_cluster = "h100x8";
  TrainStep automatic(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                      {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::AUTO, .sharding = o});
  EXPECT_EQ(files_in(dir, "train_step_4."), step_files("train_step_4"));
  EXPECT_TRUE(files_in(dir / "candidates", "").empty());
  // Nothing else was written: four steps, nine passes each.
  EXPECT_EQ(files_in(dir, "").size(), 4u * 9u) << read(dir / "train_step_4.02.sharding_decision.txt");

  // With PX_DUMP_CANDIDATES=1 the candidates go to their own folder.
  ::setenv("PX_DUMP_CANDIDATES", "1", 1);
  TrainStep again(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                  {.mesh = Mesh::cpu({{"data", 2}}), .strategy = ShardingStrategy::AUTO, .sharding = o});
  EXPECT_EQ(files_in(dir, "train_step_5."), step_files("train_step_5"));
  EXPECT_FALSE(files_in(dir / "candidates", "train_step_5.").empty());
  ::unsetenv("PX_DUMP_CANDIDATES");

  // Offloaded optimizer state: where each value lives shows too.
  TrainStepOptions host;
  host.offload.optimizer_state = true;
  TrainStep offloaded(f.model.store(), recipe_check::opt(), f.loss, f.batch_types, host);
  const std::string placed = read(dir / "train_step_6.05.offload.txt");
  EXPECT_NE(placed.find("{optimizer_state, pinned_host, blocks.0}"), std::string::npos);
  EXPECT_NE(placed.find("{params, blocks.0}"), std::string::npos);

  // A pipelined step: the stage cut writes each node's stage on the program.
  TrainStepOptions piped;
  piped.mesh = Mesh({{"stage", 2}});
  TrainStep pipelined(f.model.store(), recipe_check::opt(), f.loss, f.batch_types, piped);
  std::string stages;
  for (const std::string& name : files_in(dir, "train_step_7."))
    if (name.find("pipeline_stages") != std::string::npos) stages = read(dir / name);
  EXPECT_NE(stages.find("# forward 0, stage 0\n"), std::string::npos) << stages.substr(0, 2000);
  EXPECT_NE(stages.find("# backward 0, stage 1\n"), std::string::npos);
  fs::remove_all(base);
}

}  // namespace
}  // namespace px
