// pax train under mpirun: 2 processes of 1 device each train exactly like one process of 2 devices,
// rank 0 alone prints and writes the job dir's outputs, every process writes its checkpoint shards,
// the same command resumes, and processes launched with different configs stop with the difference.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

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
std::string pax_args(const std::string& dir, const std::string& extra) {
  return " train --exp=copy.TransformerLmTiny --set model.d_model=32 --set model.d_ff=64 --set model.n_layers=1"
         " --set model.seq_len=16 --set data.batch=4 --set data.copy_eval_batches=2 --set schedule.warmup_steps=2"
         " --set train.summary_interval=1 --set train.eval_interval=3 --set train.checkpoint_interval=3"
         " --set sharding.mesh=data:2 --set sharding.strategy=fsdp --job_log_dir=" +
         dir + " " + extra;
}

std::string mpirun_command(const std::string& args, const std::string& env = "") {
  return "PX_DEVICES=cpu:1 OMP_NUM_THREADS=1 PX_COLLECTIVE_TIMEOUT_S=60 " + env + " " + mpirun() +
         " -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none"
         " sh -c 'exec " +
         PX_PAX_BIN + args + "'";
}

Result train(bool two_processes, const std::string& dir, const std::string& extra) {
  const std::string args = pax_args(dir, extra);
  if (!two_processes) return run("OMP_NUM_THREADS=1 " + std::string(PX_PAX_BIN) + args + " --devices cpu:2");
  return run(mpirun_command(args));
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
  // pax eval under mpirun: rank 0 alone evaluates and prints, as one process does.
  const std::string eval = " eval --config " + two + "/config.toml --job_log_dir=" + two;
  Result e2 = run(mpirun_command(eval));
  ASSERT_EQ(e2.rc, 0) << e2.out;
  Result e1 = run("OMP_NUM_THREADS=1 " + std::string(PX_PAX_BIN) + eval);
  ASSERT_EQ(e1.rc, 0) << e1.out;
  EXPECT_EQ(count(e2.out, "eval step 8: "), 1u) << e2.out;
  EXPECT_EQ(e2.out.substr(e2.out.find("eval step 8: ")), e1.out.substr(e1.out.find("eval step 8: ")));
  fs::remove_all(one);
  fs::remove_all(two);
}

// A pipeline under mpirun: each process runs one stage (model.n_layers=2 over stage:2), messages
// between them; the run, its checkpoint and its resumption equal the one-process pipeline's.
TEST(PaxMpi, PipelineStagesInTwoProcessesTrainAndResumeLikeOne) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::string one = job("pipe_one"), two = job("pipe_two");
  const std::string extra =
      "--set model.n_layers=2 --set sharding.mesh=stage:2 --set sharding.strategy=ddp --set train.microbatches=2";
  Result a = train(false, one, extra + " --set train.steps=4");
  ASSERT_EQ(a.rc, 0) << a.out;
  Result b = train(true, two, extra + " --set train.steps=4");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("Mesh{stage: 2} on cpu:2 over 2 processes"), std::string::npos) << b.out;
  EXPECT_EQ(losses(two), losses(one));
  EXPECT_GE(losses(two).size(), 4u);
  EXPECT_TRUE(fs::exists(two + "/checkpoints/checkpoint_00000003/COMMITTED"));
  b = train(true, two, extra + " --set train.steps=6");
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed at step"), std::string::npos) << b.out;
  a = train(false, one, extra + " --set train.steps=6");
  EXPECT_EQ(losses(two), losses(one));
  fs::remove_all(one);
  fs::remove_all(two);
}

// AUTO under mpirun: the process holding position 0 solves, the other takes its plan; the run
// equals the one-process run of the same config (a preset cluster: the same plan in both).
TEST(PaxMpi, AutoOnTwoProcessesTrainsLikeOne) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::string one = job("auto_one"), two = job("auto_two");
  const std::string extra = "--set train.steps=4 --set sharding.strategy=auto --set sharding.cluster=h100x8";
  Result a = train(false, one, extra);
  ASSERT_EQ(a.rc, 0) << a.out;
  Result b = train(true, two, extra);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_EQ(losses(two), losses(one));
  EXPECT_EQ(losses(two).size(), 6u);  // 4 train + 2 eval lines
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

// The pid of rank `rank` of the job whose processes carry PX_TEST_TAG=tag, or -1.
pid_t find_rank(const std::string& tag, int rank) {
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream f(e.path() / "environ");
    std::string env((std::istreambuf_iterator<char>(f)), {});
    if (env.find(std::string("PX_TEST_TAG=") + tag + '\0') != std::string::npos &&
        env.find("OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + '\0') != std::string::npos) {
      std::ifstream c(e.path() / "comm");
      std::string comm;
      std::getline(c, comm);
      if (comm == "pax") return static_cast<pid_t>(std::stoi(name));
    }
  }
  return -1;
}

// A long run on 2 processes; once it has committed a checkpoint, rank 1 gets `sig`. The job must
// end non-zero naming rank 1 within the collective timeout (3 s) plus slack; the same command with
// a reachable train.steps then resumes from the last checkpoint and matches one process bitwise.
void fault_and_resume(int sig, const std::string& name) {
  const std::string two = job(name), one = job(name + "_one"), tag = std::to_string(::getpid()) + name;
  // A schedule that does not depend on train.steps: the resumed run's lr is the interrupted one's.
  const std::string sched = " --set schedule.kind=linear_warmup";
  const std::string cmd = mpirun_command(pax_args(two, "--set train.steps=100000" + sched),
                                         "PX_TEST_TAG=" + tag + " PX_COLLECTIVE_TIMEOUT_S=3");
  const std::string log = two + ".log";
  const pid_t shell = ::fork();
  ASSERT_GE(shell, 0);
  if (shell == 0) {
    ::execl("/bin/sh", "sh", "-c", (cmd + " > " + log + " 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  pid_t victim = -1;
  while (clock::now() - t0 < std::chrono::seconds(60)) {
    if (fs::exists(two + "/checkpoints/checkpoint_00000006/COMMITTED") && (victim = find_rank(tag, 1)) > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GT(victim, 0) << "no checkpoint or no rank 1 within 60 s";
  ::kill(victim, sig);
  auto t_kill = clock::now();
  int status = 0;
  ::waitpid(shell, &status, 0);
  const double seconds = std::chrono::duration<double>(clock::now() - t_kill).count();
  std::ifstream lf(log);
  std::string out((std::istreambuf_iterator<char>(lf)), {});
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_LT(seconds, 30) << out;
  EXPECT_NE(out.find("rank 1"), std::string::npos) << out;
  if (sig == SIGSTOP) EXPECT_NE(out.find("timed out after 3 s: rank 1 (host "), std::string::npos) << out;

  // Resume: the same command (with a train.steps it reaches) continues from the last checkpoint.
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(two + "/checkpoints")) {
    const std::string n = e.path().filename();
    if (n.rfind("checkpoint_", 0) == 0 && fs::exists(e.path() / "COMMITTED")) steps.push_back(std::stoll(n.substr(11)));
  }
  ASSERT_FALSE(steps.empty());
  const int64_t last = *std::max_element(steps.begin(), steps.end());
  const std::string target = "--set train.steps=" + std::to_string(last + 2) + sched;
  Result b = train(true, two, target);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed at step " + std::to_string(last)), std::string::npos) << b.out;
  Result a = train(false, one, target);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(losses(two), losses(one));
  fs::remove_all(one);
  fs::remove_all(two);
  fs::remove(log);
}

TEST(PaxMpi, AStoppedRankEndsTheJobNamingItAndTheSameCommandResumes) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  fault_and_resume(SIGSTOP, "stopped");
}

TEST(PaxMpi, AKilledRankEndsTheJobNamingItAndTheSameCommandResumes) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  fault_and_resume(SIGKILL, "killed");
}

}  // namespace

namespace {

// SIGTERM to one process of a job (srun and Slurm's preemption signal every process; a process
// may also get it alone): every process stops at the same step, the checkpoint of that step is
// committed, rank 0 says so, and the same command resumes from it and ends like one process.
TEST(PaxMpi, SigtermToARankStopsEveryRankAtTheSameSavedStepAndTheSameCommandResumes) {
  if (mpirun().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed";
  const std::string two = job("term"), one = job("term_one"), log = two + ".log";
  const std::string tag = std::to_string(::getpid()) + "term";
  const std::string sched = " --set schedule.kind=linear_warmup";
  const std::string cmd =
      mpirun_command(pax_args(two, "--set train.steps=100000 --set train.checkpoint_interval=0" + sched),
                     "PX_TEST_TAG=" + tag) +
      " > " + log + " 2>&1";
  const pid_t shell = ::fork();
  ASSERT_GE(shell, 0);
  if (shell == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  auto read_log = [&] {
    std::ifstream f(log);
    return std::string((std::istreambuf_iterator<char>(f)), {});
  };
  auto train_lines = [&] {  // whole lines only: rank 0 may be writing one
    std::ifstream f(two + "/metrics.jsonl");
    std::string text((std::istreambuf_iterator<char>(f)), {});
    return count(text.substr(0, text.find_last_of('\n') + 1), "\"split\":\"train\"");
  };
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  pid_t victim = -1;
  while (clock::now() - t0 < std::chrono::seconds(300) && (train_lines() < 2 || (victim = find_rank(tag, 1)) <= 0))
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_GT(victim, 0) << "no rank 1 or no summary within 300 s: " << read_log();
  ASSERT_EQ(::kill(victim, SIGTERM), 0);
  int status = 0;
  const auto t1 = clock::now();
  while (::waitpid(shell, &status, WNOHANG) != shell) {
    if (clock::now() - t1 > std::chrono::seconds(300)) {
      ::kill(shell, SIGKILL);
      ::waitpid(shell, &status, 0);
      FAIL() << "the job did not end within 300 s of SIGTERM: " << read_log();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string out = read_log();
  EXPECT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  const std::string said = "stopped by a signal to another process after step ";
  const size_t at = out.find(said);
  ASSERT_NE(at, std::string::npos) << out;
  EXPECT_EQ(count(out, "stopped by"), 1u) << "rank 0 alone prints: " << out;
  const int64_t step = std::stoll(out.substr(at + said.size()));
  EXPECT_NE(out.find("checkpoint step " + std::to_string(step) + " committed"), std::string::npos) << out;
  char name[32];
  std::snprintf(name, sizeof name, "checkpoint_%08lld", static_cast<long long>(step));
  EXPECT_TRUE(fs::exists(two + "/checkpoints/" + name + "/COMMITTED")) << out;

  const std::string target = "--set train.steps=" + std::to_string(step + 2) + sched;
  Result b = train(true, two, target);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("resumed at step " + std::to_string(step)), std::string::npos) << b.out;
  Result a = train(false, one, target);
  ASSERT_EQ(a.rc, 0) << a.out;
  EXPECT_EQ(losses(two), losses(one));
  fs::remove_all(one);
  fs::remove_all(two);
  fs::remove(log);
}

}  // namespace
