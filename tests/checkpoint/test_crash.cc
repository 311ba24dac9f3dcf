// Crash safety: a child process saves checkpoints in a loop (resuming from the latest, like a
// restarted job) and is killed with SIGKILL at random moments, many of them inside a write.
// After every kill, latest_step() must be a committed checkpoint that reads back exactly.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "ckpt_testing.h"

namespace px {
namespace {

using testing::CheckpointTest;

const Mesh& mesh22() {
  static const Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  return m;
}

struct Spec {
  const char* name;
  DType dtype;
  Shape shape;
  PartitionSpec spec;
};
const std::vector<Spec>& specs() {
  static const std::vector<Spec> s = {
      {"w", DType::f32, {64, 64}, {"data", "model"}}, {"w.m", DType::f32, {64, 64}, {"data", "model"}},
      {"emb", DType::bf16, {32, 64}, {"data"}},       {"b", DType::f32, {128}, {}},
      {"ids", DType::i32, {16, 4}, {px::none, "model"}},
  };
  return s;
}

// The full value of array k at `step`: every byte depends on both, so a mix-up of steps shows.
Array value(size_t k, int64_t step) {
  const Spec& s = specs()[k];
  Array a(s.dtype, s.shape);
  auto* b = static_cast<unsigned char*>(a.raw());
  uint64_t h = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1) + k;
  for (int64_t i = 0; i < a.nbytes(); ++i) {
    h ^= h >> 29;
    h *= 0xBF58476D1CE4E5B9ull;
    b[i] = static_cast<unsigned char>(h >> 56);
  }
  return a;
}

// Shards by hand (no OpenMP after fork): every mesh position gets its block.
ShardedArray sharded(const Array& full, const Sharding& s) {
  Shape local = s.local_shape(full.shape());
  std::vector<Array> shards;
  const int64_t elem = dtype_size(full.dtype());
  for (int p = 0; p < s.mesh.size(); ++p) {
    Array sh(full.dtype(), local);
    std::vector<int64_t> off = s.shard_offsets(full.shape(), p);
    // Rank <= 2 here: copy rows.
    int64_t rows = local.size() == 2 ? local[0] : 1, cols = local.empty() ? 1 : local.back();
    int64_t full_cols = full.shape().empty() ? 1 : full.shape().back();
    for (int64_t r = 0; r < rows; ++r) {
      int64_t src_row = local.size() == 2 ? off[0] + r : 0;
      int64_t src_col = local.empty() ? 0 : off.back();
      std::memcpy(static_cast<char*>(sh.raw()) + r * cols * elem,
                  static_cast<const char*>(full.raw()) + (src_row * full_cols + src_col) * elem,
                  static_cast<size_t>(cols * elem));
    }
    shards.push_back(sh);
  }
  return ShardedArray(full.type(), s, std::move(shards));
}

Checkpoint state(int64_t step) {
  Checkpoint c(step);
  for (size_t k = 0; k < specs().size(); ++k)
    c.add(specs()[k].name, sharded(value(k, step), Sharding(mesh22(), specs()[k].spec)),
          k == 1 ? "opt_state" : "params");
  c.data_state_json = "{\"step\": " + std::to_string(step) + "}";
  return c;
}

// Background writes at normal priority: the kill times are scaled by a save timed in the
// foreground, and a niced writer on a loaded machine would take many times longer.
CheckpointOptions options() {
  return {.keep_last = 2, .keep_every = 5, .background_nice = 0, .testing_file_delay_ms = 1};
}

[[noreturn]] void child(const std::string& dir) {
  ::alarm(60);  // never outlive a parent that died
  try {
    CheckpointManager m(dir, options());
    int64_t step = m.latest_step().value_or(0) + 1;
    for (;; ++step) {
      if (step % 2)
        m.save_async(state(step));
      else
        m.save(state(step));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "child: %s\n", e.what());
  }
  ::_exit(3);
}

TEST_F(CheckpointTest, SigkillAtRandomMomentsLeavesTheLatestCommittedCheckpointReadable) {
  const std::string dir = path("ckpt");
  // Kill times scale with how long one save takes on this machine: from a fifth of a save (inside
  // the first write) to several saves (some committed, the next one under way).
  double save_ms = 0;
  {
    CheckpointManager calib(path("calib"), options());
    for (int64_t step = 1; step <= 2; ++step) {
      auto t0 = std::chrono::steady_clock::now();
      calib.save(state(step));
      save_ms = std::max(save_ms, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
  }
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> wait_ms(static_cast<int>(save_ms * 0.2), static_cast<int>(save_ms * 3) + 1);
  // At least 24 kills, and more (up to 120) until at least 5 landed inside a save and step 5 was
  // committed: on a loaded machine a save's duration varies, so a fixed count could miss either.
  const int min_kills = 24, max_kills = 120;
  int inside_write = 0, kills = 0;
  int64_t last = 0;
  for (int i = 0; i < max_kills && (i < min_kills || inside_write < 5 || last < 5); ++i, ++kills) {
    pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) child(dir);
    // Later kills wait longer when the checkpoints are slow to come (a loaded machine).
    const double stretch = last < 5 ? 1.0 + i / 24.0 : 1.0;
    std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(wait_ms(rng) * stretch)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child stopped by itself (exit " << WEXITSTATUS(status) << ")";

    // A temporary or half-deleted directory left behind: the kill landed inside a save.
    bool torn = false;
    for (auto& e : std::filesystem::directory_iterator(dir)) {
      std::string n = e.path().filename().string();
      torn |= n.ends_with(".tmp") || n.ends_with(".deleting");
    }
    inside_write += torn;

    CheckpointManager m(dir);
    std::optional<int64_t> latest = m.latest_step();
    if (!latest) continue;  // killed before the first commit
    SCOPED_TRACE("kill " + std::to_string(i) + ", latest step " + std::to_string(*latest));
    EXPECT_GE(*latest, last);
    last = *latest;
    Checkpoint r = m.restore(*latest);
    ASSERT_EQ(r.entries.size(), specs().size());
    EXPECT_EQ(r.data_state_json, "{\"step\":" + std::to_string(*latest) + "}");
    for (size_t k = 0; k < specs().size(); ++k)
      EXPECT_TRUE(testing::same_bits(r.full(specs()[k].name), value(k, *latest))) << specs()[k].name;
    for (int64_t s : m.steps()) EXPECT_NO_THROW(m.verify(s)) << "step " << s;
  }
  std::printf("one save: %.0f ms; %d kills, %d inside a save, reached step %lld\n", save_ms, kills, inside_write,
              static_cast<long long>(last));
  EXPECT_GE(inside_write, 5);
  EXPECT_GE(last, 5);
}

}  // namespace
}  // namespace px
