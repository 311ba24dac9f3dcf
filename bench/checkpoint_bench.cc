// Checkpoint throughput on bench-gpt's training state (params + AdamW's two moments, f32,
// random values): the foreground part of an asynchronous save against its background write,
// and write and read MB/s against, in the same run, a plain sequential copy of the same bytes
// (one file written with write() + fsync, read back with read()) and the same bytes as plain
// files in the checkpoint's directory layout (one directory and file per tensor, then syncfs):
// the second separates the cost of the layout's file-system calls from that of our code. Page
// caches of what is read are dropped first (posix_fadvise), so reads come from the disk.
//
// With --train_rounds=R (> 0), also the stall of the training loop: bench-gpt's TrainStep (AdamW)
// timed alone, then with save_async of its state before it and 3 steps overlapping the write.
//
//   ./build/bench/checkpoint_bench [--dir=/tmp] [--reps=3] [--mesh=data:8] [--zstd=1] [--train_rounds=2]
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "bench_util.h"
#include "gpt_common.h"
#include "parallax/checkpoint.h"
#include "parallax/optim.h"
#include "parallax/train.h"

namespace px::bench {
namespace {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void drop_cache(const std::string& root) {
  auto drop = [](const fs::path& p) {
    int fd = ::open(p.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (fs::is_regular_file(root)) return drop(root);
  for (auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) drop(e.path());
}

// Random floats in [-1, 1) from a cheap generator (the values' spread is that of trained weights).
Array random_f32(const Shape& shape, uint64_t seed) {
  Array a(DType::f32, shape);
  float* p = a.data<float>();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (int64_t i = 0; i < a.numel(); ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    p[i] = static_cast<float>(static_cast<int64_t>(x >> 40) - (1 << 23)) / static_cast<float>(1 << 23);
  }
  return a;
}

void write_plain(const std::string& file, const std::vector<Array>& arrays) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (const Array& a : arrays) {
    const char* p = static_cast<const char*>(a.raw());
    size_t n = static_cast<size_t>(a.nbytes());
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w <= 0) std::abort();
      p += w;
      n -= static_cast<size_t>(w);
    }
  }
  ::fsync(fd);
  ::close(fd);
}

// The checkpoint's layout without codecs or commit: DIR/t<i>/c/0 per tensor, then one syncfs.
void write_plain_files(const std::string& dir, const std::vector<Array>& arrays) {
  fs::create_directories(dir);
  for (size_t i = 0; i < arrays.size(); ++i) {
    std::string d = dir + "/t" + std::to_string(i);
    fs::create_directories(d + "/c");
    int fd = ::open((d + "/c/0").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const char* p = static_cast<const char*>(arrays[i].raw());
    size_t n = static_cast<size_t>(arrays[i].nbytes());
    while (n > 0) {
      ssize_t w = ::write(fd, p, n);
      if (w <= 0) std::abort();
      p += w;
      n -= static_cast<size_t>(w);
    }
    ::close(fd);
  }
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  ::syncfs(fd);
  ::close(fd);
}

void read_plain(const std::string& file, std::vector<Array>& arrays) {
  int fd = ::open(file.c_str(), O_RDONLY);
  for (Array& a : arrays) {
    char* p = static_cast<char*>(a.raw());
    size_t n = static_cast<size_t>(a.nbytes());
    while (n > 0) {
      ssize_t r = ::read(fd, p, n);
      if (r <= 0) std::abort();
      p += r;
      n -= static_cast<size_t>(r);
    }
  }
  ::close(fd);
}

// The training loop's stall: the one place that runs a training step (adapt it when TrainStep changes).
void measure_stall(const std::string& dir, int rounds, int zstd) {
  GptArgs a;
  nn::TransformerLm model(a.config());
  TensorType seq{DType::i32, {a.batch, a.seq}};
  TrainStep step(model.store(), optim::adamw({.lr = 3e-4}),
                 [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); }, {seq, seq});
  TrainState st = step.init(0);
  std::vector<Array> batch = gpt_batch(a);
  const std::vector<std::string> paths = model.store().paths(), slots = step.state_names();
  step(st, batch);  // warm-up
  CheckpointManager m(dir + "/stall", {.keep_last = 1, .zstd_level = zstd});
  constexpr int kOverlap = 3;
  std::vector<double> alone, with, residual;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = clock_type::now();
    step(st, batch);
    alone.push_back(since(t0));
    Checkpoint c(st.step);
    for (size_t i = 0; i < paths.size(); ++i) c.add(paths[i], st.params[i]);
    for (size_t i = 0; i < slots.size(); ++i) c.add(slots[i], st.opt_state[i], "opt_state");
    t0 = clock_type::now();
    m.save_async(c);
    for (int k = 0; k < kOverlap; ++k) step(st, batch);
    with.push_back(since(t0));
    t0 = clock_type::now();
    m.wait();
    residual.push_back(since(t0));
  }
  const double step_s = median(alone), with_s = median(with);
  const double stall = with_s - kOverlap * step_s;
  Json()
      .s("bench", "checkpoint_stall")
      .i("threads", threads())
      .n("step_s", step_s)
      .n("save_plus_3_steps_s", with_s)
      .n("stall_s", stall)
      .n("stall_fraction_of_step", stall / step_s)
      .n("write_left_after_3_steps_s", median(residual))
      .print();
}

int run(int argc, char** argv) {
  std::string root = fs::temp_directory_path().string(), mesh_text;
  int reps = 3, zstd = 1, train_rounds = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&](const char* k) { return a.substr(std::strlen(k)); };
    if (a.rfind("--dir=", 0) == 0) root = val("--dir=");
    else if (a.rfind("--reps=", 0) == 0) reps = std::stoi(val("--reps="));
    else if (a.rfind("--mesh=", 0) == 0) mesh_text = val("--mesh=");
    else if (a.rfind("--zstd=", 0) == 0) zstd = std::stoi(val("--zstd="));
    else if (a.rfind("--train_rounds=", 0) == 0) train_rounds = std::stoi(val("--train_rounds="));
    else {
      std::fprintf(stderr, "checkpoint_bench: unknown flag %s (--dir= --reps= --mesh= --zstd= --train_rounds=)\n", a.c_str());
      return 2;
    }
  }
  const std::string dir = root + "/px_checkpoint_bench_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);

  // bench-gpt's params; optimizer state m and v of the same shapes. With --mesh, FSDP-like: dim 0
  // split over the first axis where it divides (one chunk per shard), else replicated.
  GptArgs args;
  nn::TransformerLm model(args.config());
  const nn::ParamStore& store = model.store();
  Mesh mesh;
  if (!mesh_text.empty()) {
    int64_t devices = 1;  // the product of the sizes in "data:4,model:2"
    for (size_t at = mesh_text.find(':'); at != std::string::npos; at = mesh_text.find(':', at + 1))
      devices *= std::stoll(mesh_text.substr(at + 1));
    mesh = Mesh::parse(mesh_text, DeviceSet{"cpu", devices});
  }
  Checkpoint state(1000);
  std::vector<Array> plain;
  int64_t bytes = 0, n_params = 0;
  uint64_t seed = 1;
  for (int i = 0; i < store.size(); ++i) {
    const nn::ParamSpec& p = store.spec(i);
    for (const char* slot : {"", ".m", ".v"}) {
      Array a = random_f32(p.type.shape, seed++);
      plain.push_back(a);
      bytes += a.nbytes();
      if (!*slot) n_params += a.numel();
      PartitionSpec spec;
      if (mesh.rank() > 0 && !a.shape().empty() && a.shape()[0] % mesh.axes()[0].size == 0)
        spec = PartitionSpec{mesh.axes()[0].name};
      state.add(p.path + slot, shard(a, Sharding(mesh, spec)), *slot ? "opt_state" : "params");
    }
  }
  const double mb = static_cast<double>(bytes) / 1e6;
  Json()
      .s("bench", "checkpoint_state")
      .i("params", n_params)
      .i("tensors", static_cast<int64_t>(state.entries.size()))
      .n("mb", mb)
      .s("mesh", mesh_text.empty() ? "one device" : mesh_text)
      .print();

  std::vector<double> plain_w, plain_r, files_w, sync_w, async_fg, async_bg, ckpt_r;
  int64_t step = 1000;
  for (int r = 0; r < reps; ++r) {
    const std::string file = dir + "/plain.bin";
    auto t0 = clock_type::now();
    write_plain(file, plain);
    plain_w.push_back(since(t0));
    drop_cache(file);
    std::vector<Array> back;
    for (const Array& a : plain) back.emplace_back(a.dtype(), a.shape());
    t0 = clock_type::now();
    read_plain(file, back);
    plain_r.push_back(since(t0));
    fs::remove(file);
    t0 = clock_type::now();
    write_plain_files(dir + "/files", plain);
    files_w.push_back(since(t0));
    fs::remove_all(dir + "/files");

    CheckpointManager m(dir + "/ckpt", {.keep_last = 0, .zstd_level = zstd});  // no deletion inside the timings
    state.step = ++step;
    t0 = clock_type::now();
    m.save(state);
    sync_w.push_back(since(t0));

    state.step = ++step;
    t0 = clock_type::now();
    m.save_async(state);
    async_fg.push_back(since(t0));
    t0 = clock_type::now();
    m.wait();
    async_bg.push_back(since(t0));

    drop_cache(m.path(step));
    t0 = clock_type::now();
    Checkpoint got = m.restore(step);
    ckpt_r.push_back(since(t0));
    if (got.entries.size() != state.entries.size()) std::abort();
    fs::remove_all(dir + "/ckpt");
  }
  if (train_rounds > 0) measure_stall(dir, train_rounds, zstd);
  fs::remove_all(dir);

  const double pw = median(plain_w), pr = median(plain_r), fw = median(files_w), sw = median(sync_w),
               fg = median(async_fg),
               bg = median(async_bg), cr = median(ckpt_r);
  Json()
      .s("bench", "checkpoint_write")
      .n("plain_mb_s", mb / pw)
      .n("checkpoint_mb_s", mb / sw)
      .n("plain_files_mb_s", mb / fw)
      .n("vs_plain", pw / sw)
      .n("vs_plain_files", fw / sw)
      .n("plain_s", pw)
      .n("plain_files_s", fw)
      .n("checkpoint_s", sw)
      .print();
  Json()
      .s("bench", "checkpoint_async")
      .n("foreground_s", fg)
      .n("background_s", bg)
      .n("foreground_fraction", fg / (fg + bg))
      .n("copy_mb_s", mb / fg)
      .print();
  Json()
      .s("bench", "checkpoint_read")
      .n("plain_mb_s", mb / pr)
      .n("checkpoint_mb_s", mb / cr)
      .n("vs_plain", pr / cr)
      .n("plain_s", pr)
      .n("checkpoint_s", cr)
      .print();
  return 0;
}

}  // namespace
}  // namespace px::bench

int main(int argc, char** argv) { return px::bench::run(argc, argv); }
