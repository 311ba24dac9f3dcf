// pax train under mpirun: 2 processes of 1 device each train exactly like one process of 2 devices,
// rank 0 alone prints and writes the job dir's outputs, every process writes its checkpoint shards,
// the same command resumes, and processes launched with different configs stop with the difference.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace {

struct Result {
  int rc = -1;
  std::string out;
};

Result run(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string mpirun() {
#ifdef PX_MPIEXEC
  if (fs::exists(PX_MPIEXEC)) return PX_MPIEXEC;
#endif
  return "";
}

// pax train on 2 processes (PX_DEVICES=cpu:1 each) or on one process with cpu:2; `extra` is more
// arguments (a shell word list, evaluated per rank).
Result train(bool two_processes, const std::string& dir, const std::string& extra) {
  const std::string args =
      " train --exp=copy.TransformerLmTiny --set model.d_model=32 --set model.d_ff=64 --set model.n_layers=1"
      " --set model.seq_len=16 --set data.batch=4 --set data.copy_eval_batches=2 --set schedule.warmup_steps=2"
      " --set train.summary_interval=1 --set train.eval_interval=3 --set train.checkpoint_interval=3"
      " --set sharding.mesh=data:2 --set sharding.strategy=fsdp --job_log_dir=" +
      dir + " " + extra;
  if (!two_processes) return run("OMP_NUM_THREADS=1 " + std::string(PX_PAX_BIN) + args + " --devices cpu:2");
  return run("PX_DEVICES=cpu:1 OMP_NUM_THREADS=1 PX_COLLECTIVE_TIMEOUT_S=60 " + mpirun() +
             " -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader sh -c 'exec " + PX_PAX_BIN + args + "'");
}

// (split, step, loss) of every line of metrics.jsonl.
std::vector<std::string> losses(const std::string& dir) {
  std::vector<std::string> v;
  std::ifstream f(dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    v.push_back(j["split"].get<std::string>() + " " + std::to_string(j["step"].get<int64_t>()) + " " +
                nlohmann::json(j["loss"].get<double>()).dump());
  }
  return v;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

std::string job(const std::string& name) {
  std::string d = ::testing::TempDir() + "/pax_mpi_" + std::to_string(::getpid()) + "_" + name;
  fs::remove_all(d);
  return d;
}

TEST(PaxMpi, TwoProcessesTrainAndResumeLikeOne) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::string one = job("one"), two = job("two");
  Result a = train(false, one, "--set train.steps=6");
  ASSERT_EQ(a.rc, 0) << a.out;
  Result b = train(true, two, "--set train.steps=6");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(count(b.out, "pax train copy.TransformerLmTiny"), 1u) << "rank 0 alone prints:\n" << b.out;
  EXPECT_NE(b.out.find("on cpu:2 over 2 processes"), std::string::npos) << b.out;
  EXPECT_EQ(losses(two), losses(one));  // bitwise: the same reduction order
  EXPECT_EQ(losses(two).size(), 8u);    // 6 train + 2 eval lines, written once
  EXPECT_TRUE(fs::exists(two + "/checkpoints/checkpoint_00000006/COMMITTED"));
  // The same command with more steps resumes from the last checkpoint, as one process does.
  a = train(false, one, "--set train.steps=8");
  b = train(true, two, "--set train.steps=8");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed at step 6"), std::string::npos) << b.out;
  EXPECT_EQ(losses(two), losses(one));
  fs::remove_all(one);
  fs::remove_all(two);
}

TEST(PaxMpi, ProcessesWithDifferentConfigsStopNamingTheDifference) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::string d = job("differ");
  Result r = train(true, d, "--set train.steps=$((10 + OMPI_COMM_WORLD_RANK))");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("different configs: rank 1 differs from rank 0: 'steps = 11' against 'steps = 10'"),
            std::string::npos)
      << r.out;
  fs::remove_all(d);
}

}  // namespace
