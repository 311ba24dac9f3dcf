// Logging (macro, levels, pluggable sink, check macro) and the environment parser.
#include <gtest/gtest.h>

#include <algorithm>

#include <omp.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/env.h"
#include "core/log.h"

namespace px {
namespace {

struct Captured {
  std::mutex m;
  std::vector<LogRecord> records;
};

// Installs a capturing sink and a level for the test's duration.
class LogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prev_level_ = log_level();
    prev_sink_ = set_log_sink([this](const LogRecord& r) {
      std::lock_guard<std::mutex> lock(cap_.m);
      cap_.records.push_back(r);
    });
  }
  void TearDown() override {
    set_log_sink(prev_sink_);
    set_log_level(prev_level_);
  }
  Captured cap_;
  LogSink prev_sink_;
  LogLevel prev_level_;
};

int g_evaluations = 0;
int counted() { return ++g_evaluations; }

TEST_F(LogTest, SinkReceivesRecordsAtOrAboveTheLevel) {
  set_log_level(LogLevel::info);
  PX_LOG(debug) << "hidden";
  PX_LOG(info) << "compiled " << 3 << " steps";
  int line = __LINE__ + 1;
  PX_LOG(error) << "bad";
  ASSERT_EQ(cap_.records.size(), 2u);
  EXPECT_EQ(cap_.records[0].message, "compiled 3 steps");
  EXPECT_EQ(cap_.records[0].level, LogLevel::info);
  EXPECT_EQ(std::string(cap_.records[1].file), "test_log_env.cc");
  EXPECT_EQ(cap_.records[1].line, line);
  EXPECT_EQ(cap_.records[1].level, LogLevel::error);
}

TEST_F(LogTest, DisabledRecordsAreNotBuilt) {
  set_log_level(LogLevel::warn);
  g_evaluations = 0;
  PX_LOG(info) << counted();
  EXPECT_EQ(g_evaluations, 0);
  PX_LOG(warn) << counted();
  EXPECT_EQ(g_evaluations, 1);
  set_log_level(LogLevel::off);
  PX_LOG(error) << counted();
  EXPECT_EQ(g_evaluations, 1);
  EXPECT_EQ(cap_.records.size(), 1u);
}

TEST_F(LogTest, WorksInIfElseAndFromThreads) {
  set_log_level(LogLevel::debug);
  bool flag = false;
  if (flag)
    PX_LOG(info) << "then";
  else
    PX_LOG(info) << "else";
  std::vector<std::thread> ts;
  for (int t = 0; t < 4; ++t)
    ts.emplace_back([t] {
      for (int i = 0; i < 50; ++i) PX_LOG(debug) << "thread " << t;
    });
  for (auto& t : ts) t.join();
  ASSERT_EQ(cap_.records.size(), 201u);
  EXPECT_EQ(cap_.records[0].message, "else");
}

TEST(Log, LevelNames) {
  EXPECT_EQ(log_level_from_name("debug"), LogLevel::debug);
  EXPECT_EQ(log_level_from_name("warning"), LogLevel::warn);
  EXPECT_STREQ(log_level_name(LogLevel::error), "error");
  try {
    log_level_from_name("loud");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown log level 'loud'; use one of debug, info, warn, error, off"),
              std::string::npos);
  }
}

TEST(Check, ThrowsWithConditionAndMessage) {
  int v = 7;
  EXPECT_NO_THROW(PX_CHECK(v == 7) << "never built");
  try {
    PX_CHECK(v < 0) << "value " << v << " must be negative";
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("[internal] check failed at test_log_env.cc:"), std::string::npos) << m;
    EXPECT_NE(m.find("v < 0. value 7 must be negative"), std::string::npos) << m;
  }
}

// As on a machine of `cores` cores (64: none of these values is capped).
EnvConfig parse(const std::map<std::string, std::string>& vars, int cores = 64) {
  return parse_env(
      [&](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      cores);
}

std::string parse_error(const std::map<std::string, std::string>& vars) {
  try {
    parse(vars);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Env, DefaultsAndValues) {
  EnvConfig d = parse({});
  EXPECT_EQ(d.num_threads, 0);
  EXPECT_EQ(d.log_level, LogLevel::warn);
  EXPECT_EQ(d.dump_dir, "");
  EXPECT_FALSE(d.disable_fusion);
  EnvConfig c = parse(
      {{"PX_NUM_THREADS", "3"}, {"PX_LOG_LEVEL", "debug"}, {"PX_DUMP", "/tmp/x"}, {"PX_DISABLE_FUSION", "1"}});
  EXPECT_EQ(c.num_threads, 3);
  EXPECT_EQ(c.log_level, LogLevel::debug);
  EXPECT_EQ(c.dump_dir, "/tmp/x");
  EXPECT_TRUE(c.disable_fusion);
  EXPECT_EQ(parse({{"PX_NUM_THREADS", ""}}).num_threads, 0);  // empty = unset
}

TEST(Env, MalformedValuesNameTheVariable) {
  EXPECT_EQ(parse_error({{"PX_NUM_THREADS", "many"}}),
            "[env] PX_NUM_THREADS='many' is not a thread count; use an integer >= 1 (0 = default)");
  EXPECT_NE(parse_error({{"PX_NUM_THREADS", "-2"}}).find("PX_NUM_THREADS='-2'"), std::string::npos);
  EXPECT_EQ(parse_error({{"PX_LOG_LEVEL", "chatty"}}),
            "[env] PX_LOG_LEVEL='chatty' is not a log level; use debug, info, warn, error or off");
  EXPECT_EQ(parse_error({{"PX_DISABLE_FUSION", "maybe"}}),
            "[env] PX_DISABLE_FUSION='maybe' is not a boolean; use 1 or 0");
  EXPECT_EQ(parse_error({{"PX_CUDA_TF32", "fast"}}), "[env] PX_CUDA_TF32='fast' is not a boolean; use 1 or 0");
  EXPECT_TRUE(parse({{"PX_CUDA_TF32", "1"}}).cuda_tf32);
  EXPECT_FALSE(parse({}).cuda_tf32);
}

TEST(Env, DevicesAreCpuOrCpuN) {
  EnvConfig d = parse({});
  EXPECT_EQ(d.device_platform, "cpu");
  EXPECT_EQ(d.device_count, 1);
  EXPECT_EQ(parse({{"PX_DEVICES", "cpu:8"}}).device_count, 8);
  EXPECT_EQ(parse({{"PX_DEVICES", "cpu"}}).device_count, 1);
  EXPECT_EQ(parse({{"PX_DEVICES", " CPU : 4 "}}).device_count, 4);  // case and spaces do not matter
  EXPECT_EQ(parse({{"PX_DEVICES", ""}}).device_count, 1);           // empty = unset
}

// A bad PX_DEVICES does not fail parse_env (plain compiles need no devices): the error is kept
// and thrown where devices are used (default_devices()).
TEST(Env, BadDevicesNameTheVariableAndTheForms) {
  auto parse_error = [](const std::map<std::string, std::string>& vars) { return parse(vars).devices_error; };
  const std::string forms =
      "use cpu (one device) or cpu:N with 1 <= N <= 65536 (N virtual CPU devices, e.g. cpu:8); another backend's "
      "devices likewise (ref:2)";
  // A platform is any backend's name: one that has none fails where a program compiles for it.
  EXPECT_EQ(parse_error({{"PX_DEVICES", "tpu:4"}}), "");
  EXPECT_EQ(parse({{"PX_DEVICES", "ref:2"}}).device_platform, "ref");
  for (const char* bad : {"cpu:0", "cpu:-2", "cpu:", "cpu:x", "cpu:8:2", "cpu-8", "cpu:1000000", ":4", "8:cpu"})
    EXPECT_EQ(parse_error({{"PX_DEVICES", bad}}),
              "[env] PX_DEVICES='" + std::string(bad) + "' is not a device set; " + forms);
  // cuda, like tpu, is checked against the registered backends where devices are used
  // (tests/backend/test_platforms.cc: DeviceSetsNameOnlyRegisteredPlatforms).
  EXPECT_EQ(parse_error({{"PX_DEVICES", "cuda:2"}}), "");
  EXPECT_EQ(parse_device_text("cpu:3", "[x] "), (std::pair<std::string, int64_t>{"cpu", 3}));
}

TEST(Env, EveryVariableIsDocumented) {
  std::vector<std::string> names;
  for (const EnvVariable& v : env_variables()) {
    names.push_back(v.name);
    EXPECT_GT(std::string(v.help).size(), 10u) << v.name;
  }
  for (const char* want : {"PX_NUM_THREADS", "PX_LOG_LEVEL", "PX_DUMP", "PX_DISABLE_FUSION", "PX_DEVICES"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
}

// A PX_ variable within two edits of one the library reads is named with that one; the library's
// own, other tools' (further off) and other variables are not.
TEST(Env, AMisspeltVariableIsNamedWithTheOneMeant) {
  const std::string note =
      misspelt_env_note({"PX_DEVICE", "px_profle", "PX_DEVICES", "PX_BUILD_DIR", "HOME", "PX_TEST_VENV"});
  EXPECT_NE(note.find("[env] PX_DEVICE is set but parallax reads no such variable; did you mean PX_DEVICES?"),
            std::string::npos)
      << note;
  EXPECT_NE(note.find("[env] px_profle is set but parallax reads no such variable; did you mean PX_PROFILE?"),
            std::string::npos)
      << note;
  EXPECT_EQ(std::count(note.begin(), note.end(), '\n'), 1) << note;  // two lines: nothing on the others
  EXPECT_EQ(misspelt_env_note({"PX_DEVICES", "PX_NUM_THREADS", "PX_BUILD_DIR", "PATH"}), "");
}

// More threads than cores: capped at the cores, with a note that apply_thread_settings() logs.
TEST(Env, NumThreadsAreCappedAtTheCores) {
  EnvConfig c = parse({{"PX_NUM_THREADS", "4096"}}, 2);
  EXPECT_EQ(c.num_threads, 2);
  EXPECT_EQ(c.num_threads_note,
            "[env] PX_NUM_THREADS=4096 is more than the 2 cores this process may run on; using 2 threads (more "
            "threads than cores only wait for each other); set PX_NUM_THREADS <= 2 or 0 for the default");
  EXPECT_EQ(parse({{"PX_NUM_THREADS", "2"}}, 2).num_threads, 2);
  EXPECT_EQ(parse({{"PX_NUM_THREADS", "2"}}, 2).num_threads_note, "");
  EXPECT_EQ(parse({{"PX_NUM_THREADS", "0"}}, 2).num_threads, 0);
  EXPECT_NE(parse_error({{"PX_NUM_THREADS", "5000"}}).find("not a thread count"), std::string::npos);
  EXPECT_GE(available_cores(), 1);
}

// Runs itself again with PX_NUM_THREADS set: the variable is read once per process, and a count
// above the cores is capped with one warning.
TEST(Env, NumThreadsSetsTheOpenMPThreadCount) {
  if (const char* v = std::getenv("PX_NUM_THREADS_CHILD")) {
    std::vector<std::string> warnings;
    LogSink old = set_log_sink([&](const LogRecord& r) { warnings.push_back(r.message); });
    apply_thread_settings();
    apply_thread_settings();
    set_log_sink(old);
    const int want = std::min(std::atoi(v), available_cores());
    EXPECT_EQ(env().num_threads, want);
    EXPECT_EQ(omp_get_max_threads(), want);
    EXPECT_EQ(warnings.size(), std::atoi(v) > available_cores() ? 1u : 0u);
    return;
  }
  for (int n : {1, 4096}) {
    std::string cmd = "PX_NUM_THREADS=" + std::to_string(n) + " PX_NUM_THREADS_CHILD=" + std::to_string(n) + " /proc/" +
                      std::to_string(getpid()) +
                      "/exe --gtest_filter=Env.NumThreadsSetsTheOpenMPThreadCount > /dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << n;
  }
}

}  // namespace
}  // namespace px
