// Checkpoints: bit-exact round trips across shardings and dtypes, metadata, the commit protocol's
// visible effects, the keep policy, asynchronous error reporting, damage detection and export.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <filesystem>
#include <thread>
#include <limits>

#include "ckpt_testing.h"
#include "core/log.h"
#include "io/zarr.h"
#include "parallax/io.h"
#include "testing.h"

namespace px {
namespace {

using testing::CheckpointTest;
using testing::error_of;
using testing::random_bits;
using testing::same_bits;
namespace fs = std::filesystem;

const Mesh& mesh42() {
  static const Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  return m;
}

// Arrays of every dtype on {data:4, model:2} with several specs (split both ways, one way,
// replicated), with their full values.
struct State {
  Checkpoint ckpt;
  std::map<std::string, Array> full;
};

State make_state(int64_t step, uint32_t seed = 1) {
  State s;
  s.ckpt = Checkpoint(step);
  struct Spec {
    const char* name;
    DType dtype;
    Shape shape;
    PartitionSpec spec;
    const char* group;
  };
  const std::vector<Spec> specs = {
      {"w.f32", DType::f32, {16, 8}, {"data", "model"}, "params"},
      {"w.bf16", DType::bf16, {8, 6}, {"data", px::none}, "params"},
      {"w.f16", DType::f16, {4, 10}, {px::none, "model"}, "params"},
      {"w.i32", DType::i32, {24}, {{"data", "model"}}, "params"},
      {"b.f32", DType::f32, {5}, {}, "params"},
      {"scalar", DType::f32, {}, {}, "params"},
      {"w.f32.m", DType::f32, {16, 8}, {"data", px::none}, "opt_state"},
      {"mask", DType::boolean, {8, 2}, {"data", px::none}, "opt_state"},
  };
  uint32_t k = seed;
  for (const Spec& sp : specs) {
    Array a = random_bits(sp.dtype, sp.shape, k++);
    s.full[sp.name] = a;
    s.ckpt.add(sp.name, shard(a, Sharding(mesh42(), sp.spec)), sp.group);
  }
  s.ckpt.config_json = R"({"model": {"d_model": 128}, "lr": 0.003})";
  s.ckpt.data_state_json = R"({"epoch": 1, "offset": 4096})";
  s.ckpt.rng_state_json = R"({"seed": 7, "counter": 12})";
  return s;
}

TEST_F(CheckpointTest, RoundTripOntoOtherShardingsIsBitExact) {
  State s = make_state(100);
  CheckpointManager m(path("ckpt"));
  m.save(s.ckpt);
  ASSERT_EQ(m.latest_step(), 100);

  const Mesh m8 = Mesh::cpu({{"data", 8}});
  const Mesh m2 = Mesh::cpu({{"model", 2}});
  // Each target: name -> sharding; names left out come back on one device.
  std::vector<std::map<std::string, Sharding>> targets = {
      {},  // one device
      {{"w.f32", Sharding(m8, {"data"})}, {"w.bf16", Sharding(m8, {"data"})}, {"w.i32", Sharding(m8, {"data"})},
       {"w.f32.m", Sharding(m8, {px::none, "data"})}, {"mask", Sharding(m8, {"data"})}},
      {{"w.f32", Sharding(m2, {px::none, "model"})}, {"w.bf16", Sharding(m2, {"model"})},
       {"w.f16", Sharding(m2, {px::none, "model"})}, {"b.f32", Sharding(m2, {})}},
      {{"w.f32", Sharding(mesh42(), {"data", "model"})}, {"w.i32", Sharding(mesh42(), {{"data", "model"}})}},
      {{"w.f32", Sharding(mesh42(), {"model", "data"})}, {"w.f16", Sharding(mesh42(), {"data", "model"})}},
  };
  for (size_t t = 0; t < targets.size(); ++t) {
    RestoreOptions o;
    o.shardings = targets[t];
    Checkpoint r = m.restore(100, o);
    ASSERT_EQ(r.entries.size(), s.full.size());
    for (auto& [name, want] : s.full) {
      SCOPED_TRACE("target " + std::to_string(t) + " array " + name);
      const ShardedArray& got = r.get(name);
      auto it = o.shardings.find(name);
      if (it != o.shardings.end()) {
        EXPECT_EQ(got.sharding(), it->second);
      } else {
        EXPECT_EQ(got.mesh().size(), 1);
      }
      EXPECT_TRUE(same_bits(r.full(name), want));
      // Every shard holds its own block (replicas included).
      ShardedArray expect = shard(want, got.sharding());
      for (int p = 0; p < got.mesh().size(); ++p) EXPECT_TRUE(same_bits(got.shard(p), expect.shard(p)));
    }
  }
}

TEST_F(CheckpointTest, MetadataAndGroups) {
  State s = make_state(7);
  CheckpointManager m(path("ckpt"));
  m.save(s.ckpt);
  CheckpointInfo info = m.info(7);
  EXPECT_EQ(info.step, 7);
  EXPECT_EQ(info.library_version, "0.1.0");
  EXPECT_EQ(info.config_json, R"({"lr":0.003,"model":{"d_model":128}})");
  EXPECT_EQ(info.data_state_json, R"({"epoch":1,"offset":4096})");
  ASSERT_EQ(info.arrays.size(), 8u);
  EXPECT_EQ(info.arrays[0].name, "w.f32");
  EXPECT_EQ(info.arrays[0].mesh, "data:4,model:2");
  EXPECT_EQ(info.arrays[0].sharding, "P('data', 'model')");
  EXPECT_EQ(info.arrays[0].chunk_shape, (Shape{4, 4}));
  EXPECT_EQ(info.arrays[6].group, "opt_state");

  RestoreOptions params;
  params.group = "params";
  Checkpoint r = m.restore(7, params);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"w.f32", "w.bf16", "w.f16", "w.i32", "b.f32", "scalar"}));
  EXPECT_EQ(r.rng_state_json, R"({"counter":12,"seed":7})");
  EXPECT_EQ(r.library_version, "0.1.0");

  // The layout on disk: one Zarr array per tensor, one chunk per distinct shard.
  const std::string dir = m.path(7);
  EXPECT_EQ(dir, path("ckpt") + "/checkpoint_00000007");
  EXPECT_TRUE(fs::exists(dir + "/COMMITTED"));
  EXPECT_TRUE(fs::exists(dir + "/zarr.json"));
  EXPECT_TRUE(fs::exists(dir + "/w.f32/c/3/1"));
  EXPECT_TRUE(fs::exists(dir + "/w.bf16/c/3/0"));    // split over data only: replicas over model written once
  EXPECT_FALSE(fs::exists(dir + "/w.bf16/c/3/1"));
  EXPECT_TRUE(fs::exists(dir + "/b.f32/c/0"));       // replicated: one chunk
  EXPECT_FALSE(fs::exists(dir + "/b.f32/c/1"));
  EXPECT_TRUE(fs::exists(dir + "/scalar/c"));
}

TEST_F(CheckpointTest, KeepPolicyKeepsLastNAndEveryKth) {
  CheckpointManager m(path("ckpt"), {.keep_last = 2, .keep_every = 4});
  for (int64_t step = 1; step <= 10; ++step) {
    Checkpoint c(step);
    c.add("x", Array::from_f32({static_cast<float>(step)}, {1}));
    if (step % 2) m.save(c);
    else m.save_async(c);
  }
  m.wait();
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{4, 8, 9, 10}));
  EXPECT_EQ(m.restore(8).full("x").to_f32(), (std::vector<float>{8}));
  // Nothing but committed checkpoints is left behind.
  for (auto& e : fs::directory_iterator(path("ckpt")))
    EXPECT_EQ(e.path().filename().string().find(".tmp"), std::string::npos) << e.path();

  CheckpointManager all(path("all"), {.keep_last = 0});
  for (int64_t step = 0; step < 5; ++step) {
    Checkpoint c(step);
    c.add("x", Array::from_f32({1}, {1}));
    all.save(c);
  }
  EXPECT_EQ(all.steps().size(), 5u);
}

TEST_F(CheckpointTest, AsyncSaveCopiesTheStateAndReportsFailures) {
  CheckpointManager m(path("ckpt"));
  Array x = Array::from_f32({1, 2, 3, 4}, {4});
  Checkpoint c(1);
  c.add("x", x);
  m.save_async(c);
  x.data<float>()[0] = 99;  // the training step goes on writing its buffers
  m.wait();
  EXPECT_EQ(m.restore(1).full("x").to_f32(), (std::vector<float>{1, 2, 3, 4}));

  // A directory that cannot be made: the failure comes from wait(), once.
  testing::write_bytes(path("file"), "not a directory");
  CheckpointManager bad(path("file") + "/ckpt");
  bad.save_async(c);
  std::string err = error_of([&] { bad.wait(); });
  EXPECT_NE(err.find(path("file")), std::string::npos) << err;
  EXPECT_NE(err.find("is not a directory"), std::string::npos) << err;
  EXPECT_EQ(error_of([&] { bad.wait(); }), "<no error>");
  // ... or from the next save, before it starts.
  bad.save_async(c);
  Checkpoint c2(2);
  c2.add("x", x);
  err = error_of([&] { bad.save_async(c2); });
  EXPECT_NE(err.find("is not a directory"), std::string::npos) << err;
  EXPECT_FALSE(bad.pending());

  // Nobody waits: the manager's destructor logs the failure.
  std::vector<std::string> logged;
  LogSink previous = set_log_sink([&](const LogRecord& r) { logged.push_back(r.message); });
  {
    CheckpointManager dropped(path("file") + "/ckpt");
    dropped.save_async(c);
  }
  set_log_sink(previous);
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find("asynchronous save of step 1 failed and nobody waited for it"), std::string::npos)
      << logged[0];
}

TEST_F(CheckpointTest, MultiProcessHooksRunAtTheirStages) {
  std::vector<std::string> stages;
  CheckpointOptions o;
  o.processes.barrier = [&](const std::string& stage) {
    stages.push_back(stage + (fs::exists(path("ckpt") + "/checkpoint_00000003.tmp") ? " tmp" : " -") +
                     (fs::exists(path("ckpt") + "/checkpoint_00000003.tmp/x/c/0") ? " chunk" : ""));
  };
  CheckpointManager m(path("ckpt"), o);
  Checkpoint c(3);
  c.add("x", Array::from_f32({1, 2}, {2}));
  m.save(c);
  EXPECT_EQ(stages, (std::vector<std::string>{"prepared tmp", "written tmp chunk"}));
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{3}));

  // A process other than 0 writes its chunks but leaves the commit to process 0.
  CheckpointOptions other;
  other.processes.index = 1;
  CheckpointManager m1(path("ckpt1"), other);
  fs::create_directories(path("ckpt1") + "/checkpoint_00000003.tmp");
  m1.save(c);
  EXPECT_TRUE(fs::exists(path("ckpt1") + "/checkpoint_00000003.tmp/x/c/0"));
  EXPECT_FALSE(fs::exists(path("ckpt1") + "/checkpoint_00000003.tmp/metadata.json"));
  EXPECT_TRUE(m1.steps().empty());
}

TEST_F(CheckpointTest, SaveRejectsBadInput) {
  CheckpointManager m(path("ckpt"));
  Checkpoint c(5);
  c.add("x", Array::from_f32({1}, {1}));
  m.save(c);
  EXPECT_NE(error_of([&] { m.save(c); }).find("already exists"), std::string::npos);
  Checkpoint old(3);
  old.add("x", Array::from_f32({1}, {1}));
  EXPECT_NE(error_of([&] { m.save_async(old); }).find("older than the committed step 5"), std::string::npos);

  Checkpoint bad(6);
  bad.add("a/b", Array::from_f32({1}, {1}));
  EXPECT_NE(error_of([&] { m.save(bad); }).find("array name 'a/b'"), std::string::npos);
  Checkpoint twice(6);
  twice.add("x", Array::from_f32({1}, {1}));
  twice.add("x", Array::from_f32({1}, {1}));
  EXPECT_NE(error_of([&] { m.save(twice); }).find("'x' is used twice"), std::string::npos);
  Checkpoint json(6);
  json.config_json = "{not json";
  EXPECT_NE(error_of([&] { m.save(json); }).find("config_json is not valid JSON"), std::string::npos);
  Checkpoint partial(6);
  partial.add("p", shard(Array::from_f32({1, 2}, {2}), Sharding(mesh42(), {}, {"model"})));
  EXPECT_NE(error_of([&] { m.save(partial); }).find("partial sums"), std::string::npos);
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{5}));

  // Continuing from an earlier step means removing the newer checkpoints first.
  m.remove(5);
  m.save(old);
  EXPECT_EQ(m.latest_step(), 3);
}

TEST_F(CheckpointTest, UncommittedDirectoriesAreIgnoredAndCleanedUp) {
  CheckpointManager m(path("ckpt"));
  Checkpoint c(2);
  c.add("x", Array::from_f32({1}, {1}));
  m.save(c);
  // What a crash leaves: a temporary directory, a half-deleted one, and a step dir without its marker.
  fs::copy(m.path(2), m.path(3) + ".tmp", fs::copy_options::recursive);
  fs::copy(m.path(2), m.path(1) + ".deleting", fs::copy_options::recursive);
  fs::copy(m.path(2), m.path(4), fs::copy_options::recursive);
  fs::remove(m.path(4) + "/COMMITTED");
  EXPECT_EQ(m.steps(), (std::vector<int64_t>{2}));
  EXPECT_NE(error_of([&] { m.restore(4); }).find("not a committed checkpoint"), std::string::npos);
  EXPECT_NE(error_of([&] { m.restore(9); }).find("committed steps in " + path("ckpt") + ": 2"), std::string::npos);

  Checkpoint c5(5);
  c5.add("x", Array::from_f32({5}, {1}));
  m.save(c5);
  std::vector<std::string> left;
  for (auto& e : fs::directory_iterator(path("ckpt"))) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"checkpoint_00000002", "checkpoint_00000005"}));
}

TEST_F(CheckpointTest, CorruptedOrTruncatedChunksGiveClearErrors) {
  CheckpointManager m(path("ckpt"));
  State s1 = make_state(10, 1), s2 = make_state(20, 50);
  m.save(s1.ckpt);
  m.save(s2.ckpt);
  const std::string chunk = m.path(20) + "/w.f32/c/1/0";
  std::string bytes = testing::read_bytes(chunk);
  std::string flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x10;
  testing::write_bytes(chunk, flipped);
  std::string err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("array 'w.f32' chunk c/1/0"), std::string::npos) << err;
  EXPECT_NE(err.find("checksum mismatch"), std::string::npos) << err;
  EXPECT_NE(err.find("restore_step=10"), std::string::npos) << err;
  EXPECT_EQ(error_of([&] { m.verify(20); }), err);
  // Arrays that are not asked for are not read.
  RestoreOptions only;
  only.only = {"w.bf16"};
  EXPECT_TRUE(same_bits(m.restore(20, only).full("w.bf16"), s2.full["w.bf16"]));

  testing::write_bytes(chunk, bytes.substr(0, bytes.size() - 9));
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("array 'w.f32' chunk c/1/0"), std::string::npos) << err;
  EXPECT_NE(err.find("corrupted or truncated"), std::string::npos) << err;
  testing::write_bytes(chunk, "");
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("truncated: 0 bytes"), std::string::npos) << err;
  fs::remove(chunk);
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("chunk c/1/0"), std::string::npos) << err;
  EXPECT_NE(err.find("missing"), std::string::npos) << err;

  const std::string meta = m.path(20) + "/w.i32/zarr.json";
  testing::write_bytes(meta, testing::read_bytes(meta).substr(0, 40));
  RestoreOptions i32;
  i32.only = {"w.i32"};
  err = error_of([&] { m.restore(20, i32); });
  EXPECT_NE(err.find(meta + ": not valid JSON (truncated?)"), std::string::npos) << err;
  EXPECT_NE(err.find("restore_step=10"), std::string::npos) << err;

  testing::write_bytes(m.path(20) + "/metadata.json", "{\"format\": \"parallax.ch");
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("metadata.json: not valid JSON"), std::string::npos) << err;

  // The earlier checkpoint is intact.
  Checkpoint r = m.restore(10);
  for (auto& [name, want] : s1.full) EXPECT_TRUE(same_bits(r.full(name), want)) << name;
}

// Found by the fuzzer: numbers that are not integers (1e300) where shapes, steps and versions are
// read got a cast with undefined behaviour; now each is an error naming the field.
TEST_F(CheckpointTest, NonIntegerNumbersInMetadataAreErrors) {
  CheckpointManager m(path("ckpt"));
  State s = make_state(1);
  m.save(s.ckpt);
  const std::string meta = m.path(1) + "/metadata.json", good = testing::read_bytes(meta);
  auto with = [&](const std::string& file, const std::string& from, const std::string& to) {
    std::string text = testing::read_bytes(file);
    size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    testing::write_bytes(file, text.replace(at, from.size(), to));
  };
  with(meta, "\"shape\": [", "\"shape\": [1e300, ");
  std::string err = error_of([&] { m.restore(1); });
  EXPECT_NE(err.find("shape must be an integer, got 1e+300"), std::string::npos) << err;
  testing::write_bytes(meta, good);
  with(meta, "\"step\": 1", "\"step\": 18446744073709551615");
  err = error_of([&] { m.restore(1); });
  EXPECT_NE(err.find("step is too large"), std::string::npos) << err;
  testing::write_bytes(meta, good);
  const std::string zmeta = m.path(1) + "/w.i32/zarr.json";
  with(zmeta, "\"shape\": [", "\"shape\": [-2.5, ");
  err = error_of([&] { m.restore(1); });
  EXPECT_NE(err.find("shape must be an integer, got -2.5"), std::string::npos) << err;
}

TEST_F(CheckpointTest, RestoreRejectsUnknownNamesAndUnfitShardings) {
  CheckpointManager m(path("ckpt"));
  State s = make_state(1);
  m.save(s.ckpt);
  RestoreOptions o;
  o.shardings = {{"nope", Sharding::replicated(mesh42())}};
  EXPECT_NE(error_of([&] { m.restore(1, o); }).find("names array 'nope'"), std::string::npos);
  o.shardings = {{"w.bf16", Sharding(Mesh::cpu({{"data", 16}}), {"data"})}};  // 8 rows over 16 devices
  std::string err = error_of([&] { m.restore(1, o); });
  EXPECT_NE(err.find("checkpoint array 'w.bf16'"), std::string::npos) << err;
}

TEST_F(CheckpointTest, ExportToSafetensorsAndImport) {
  State s = make_state(30);
  CheckpointManager m(path("ckpt"));
  m.save(s.ckpt);
  export_safetensors(m.path(30), path("model.safetensors"));
  SafetensorsFile f = load_safetensors(path("model.safetensors"));
  EXPECT_EQ(f.names, (std::vector<std::string>{"w.f32", "w.bf16", "w.f16", "w.i32", "b.f32", "scalar"}));
  EXPECT_EQ(f.metadata.at("step"), "30");
  for (size_t i = 0; i < f.names.size(); ++i) EXPECT_TRUE(same_bits(f.arrays[i], s.full[f.names[i]])) << f.names[i];

  export_safetensors(m.path(30), path("opt.safetensors"), "opt_state");
  EXPECT_EQ(load_safetensors(path("opt.safetensors")).names, (std::vector<std::string>{"w.f32.m", "mask"}));
  EXPECT_NE(error_of([&] { export_safetensors(m.path(30), path("x.safetensors"), "grads"); })
                .find("no arrays in group 'grads'; its groups: 'params', 'opt_state'"),
            std::string::npos);

  RestoreOptions o;
  o.shardings = {{"w.f32", Sharding(mesh42(), {"data", "model"})}};
  Checkpoint back = import_safetensors(path("model.safetensors"), o);
  EXPECT_EQ(back.step, 30);
  EXPECT_EQ(back.get("w.f32").sharding(), o.shardings["w.f32"]);
  for (auto& n : back.names()) EXPECT_TRUE(same_bits(back.full(n), s.full[n])) << n;
  // A step that is not one was read as step 0.
  for (const std::string bad : {"abc", "-4", "12x", ""}) {
    save_safetensors(path("bad_step.safetensors"), {"w"}, {s.full["b.f32"]}, {{"step", bad}});
    EXPECT_EQ(error_of([&] { import_safetensors(path("bad_step.safetensors")); }),
              "[checkpoint] " + path("bad_step.safetensors") + ": the metadata's step '" + bad +
                  "' is not a step (an integer >= 0); fix or remove the \"step\" entry of the file's metadata");
  }
}

// A chunk file's checksum covers its bytes only: a chunk swapped with another of the same size,
// copied from another array, or left from another step had a valid checksum and restored as other
// values. Each chunk's tag binds it to its array, chunk index and step.
TEST_F(CheckpointTest, SwappedMovedOrStaleChunksAreRefused) {
  CheckpointManager m(path("ckpt"));
  State s1 = make_state(10, 1), s2 = make_state(20, 50);
  m.save(s1.ckpt);
  m.save(s2.ckpt);
  const std::string a = m.path(20) + "/w.f32/c/0/0", b = m.path(20) + "/w.f32/c/1/0";
  const std::string bytes_a = testing::read_bytes(a), bytes_b = testing::read_bytes(b);
  testing::write_bytes(a, bytes_b);
  testing::write_bytes(b, bytes_a);
  std::string err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("array 'w.f32' chunk c/0/0"), std::string::npos) << err;
  EXPECT_NE(err.find("holds chunk c/1/0 of array 'w.f32' (f32) of step 20, not chunk c/0/0 of array 'w.f32' (f32) of step 20"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("restore_step=10"), std::string::npos) << err;
  testing::write_bytes(a, bytes_a);
  testing::write_bytes(b, bytes_b);

  // The same chunk from the older checkpoint (stale).
  const std::string stale = m.path(10) + "/w.f32/c/1/0";
  testing::write_bytes(b, testing::read_bytes(stale));
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("holds chunk c/1/0 of array 'w.f32' (f32) of step 10, not chunk c/1/0 of array 'w.f32' (f32) of step 20"),
            std::string::npos)
      << err;
  testing::write_bytes(b, bytes_b);

  // Another array's chunk of the same type.
  Checkpoint twins(30);
  twins.add("x", Array::from_f32(std::vector<float>(8, 1.0f), {8}));
  twins.add("y", Array::from_f32(std::vector<float>(8, 2.0f), {8}));
  m.save(twins);
  testing::write_bytes(m.path(30) + "/x/c/0", testing::read_bytes(m.path(30) + "/y/c/0"));
  err = error_of([&] { m.restore(30); });
  EXPECT_NE(err.find("holds chunk c/0 of array 'y' (f32) of step 30, not chunk c/0 of array 'x' (f32) of step 30"),
            std::string::npos)
      << err;
  EXPECT_EQ(error_of([&] { m.verify(30); }), err);
}

// Checkpoints written before chunk tags (no "chunk_tags" in metadata.json, untagged chunks) still
// restore; in a checkpoint that has tags, an untagged chunk is refused.
TEST_F(CheckpointTest, CheckpointsWithoutChunkTagsStillRestore) {
  CheckpointManager m(path("ckpt"));
  State s = make_state(10);
  m.save(s.ckpt);
  const std::string chunk = m.path(10) + "/w.f32/c/1/0";
  std::string tagged = testing::read_bytes(chunk);
  std::vector<char> raw(4 * 4 * sizeof(float)), untagged;  // one {4, 4} f32 chunk
  std::string tag;
  ASSERT_EQ(zarr::decode_chunk(tagged.data(), tagged.size(), raw.data(), raw.size(), &tag), "");
  EXPECT_EQ(tag, "parallax-chunk/2\n10\nc/1/0\nf32\nw.f32");
  zarr::encode_chunk(raw.data(), raw.size(), 1, untagged);
  testing::write_bytes(chunk, std::string(untagged.begin(), untagged.end()));
  std::string err = error_of([&] { m.restore(10); });
  EXPECT_NE(err.find("chunk c/1/0"), std::string::npos) << err;
  EXPECT_NE(err.find("has no tag naming its array, chunk and step"), std::string::npos) << err;

  // Version 1 tags (no dtype), as checkpoints before version 2 have them, still restore.
  const std::string meta = m.path(10) + "/metadata.json";
  std::string text = testing::read_bytes(meta);
  const std::string field = "\"chunk_tags\": 2,";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  std::map<std::string, std::string> v2_chunks;  // w.f32's chunks ({4, 4} f32 each), tagged as version 1
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 2; ++j) {
      const std::string key = "c/" + std::to_string(i) + "/" + std::to_string(j), file = m.path(10) + "/w.f32/" + key;
      v2_chunks[file] = file == chunk ? tagged : testing::read_bytes(file);
      std::vector<char> v1;
      ASSERT_EQ(zarr::decode_chunk(v2_chunks[file].data(), v2_chunks[file].size(), raw.data(), raw.size()), "");
      zarr::encode_chunk(raw.data(), raw.size(), 1, v1, "parallax-chunk/1\n10\n" + key + "\nw.f32");
      testing::write_bytes(file, std::string(v1.begin(), v1.end()));
    }
  std::string v1_text = text;
  testing::write_bytes(meta, v1_text.replace(v1_text.find(field), field.size(), "\"chunk_tags\": 1,"));
  RestoreOptions only;
  only.only = {"w.f32"};
  EXPECT_TRUE(same_bits(m.restore(10, only).full("w.f32"), s.full["w.f32"]));
  for (const auto& [file, bytes] : v2_chunks) testing::write_bytes(file, bytes);
  testing::write_bytes(chunk, std::string(untagged.begin(), untagged.end()));

  // The old format: no "chunk_tags" in the metadata; every chunk untagged.
  ASSERT_NE(text.find(field), std::string::npos) << text;
  testing::write_bytes(meta, text.replace(text.find(field), field.size(), ""));
  Checkpoint r = m.restore(10);
  for (auto& [name, want] : s.full) EXPECT_TRUE(same_bits(r.full(name), want)) << name;
}

// An array's dtype edited to another of the same size, in metadata.json and zarr.json alike,
// restored the bytes as other values; each chunk's tag names its dtype.
TEST_F(CheckpointTest, AnEditedDtypeIsRefused) {
  CheckpointManager m(path("ckpt"));
  Checkpoint c(7);
  c.add("x", Array::from_f32({1.5f, -2.0f}, {2}));
  m.save(c);
  auto edit = [&](const std::string& file, const std::string& from, const std::string& to) {
    std::string text = testing::read_bytes(file);
    size_t at;
    while ((at = text.find(from)) != std::string::npos) text.replace(at, from.size(), to);
    testing::write_bytes(file, text);
  };
  edit(m.path(7) + "/metadata.json", "\"f32\"", "\"i32\"");
  edit(m.path(7) + "/x/zarr.json", "\"float32\"", "\"int32\"");
  edit(m.path(7) + "/x/zarr.json", "\"f32\"", "\"i32\"");
  ASSERT_EQ(m.info(7).arrays.at(0).type.dtype, DType::i32);
  const std::string err = error_of([&] { m.restore(7); });
  EXPECT_NE(err.find("array 'x' chunk c/0"), std::string::npos) << err;
  EXPECT_NE(err.find("holds chunk c/0 of array 'x' (f32) of step 7, not chunk c/0 of array 'x' (i32) of step 7"),
            std::string::npos) << err;
  EXPECT_NE(err.find("or the array's dtype in metadata.json and zarr.json was edited"), std::string::npos) << err;
}

// save/save_async/wait/remove from two threads raced on the pending save's thread (std::terminate
// when both started one); now a call while another runs is a px::UserError.
TEST_F(CheckpointTest, ConcurrentSavesAreAnErrorNotACrash) {
  CheckpointManager m(path("ckpt"));
  std::atomic<int> refused{0}, other{0}, saved{0};
  std::atomic<int64_t> next{1};
  auto run = [&] {
    for (int i = 0; i < 20; ++i) {
      try {
        const int64_t step = next.fetch_add(1);
        Checkpoint c(step);
        c.add("x", Array::from_f32(std::vector<float>(1 << 14, 1.0f), {1 << 14}));
        if (i % 2) {
          m.save_async(c);
        } else {
          m.save(c);
        }
        saved.fetch_add(1);
      } catch (const UserError& e) {
        const std::string w = e.what();
        (w.find("this checkpoint manager (save, save_async, wait, remove) is already running on another thread") !=
                 std::string::npos
             ? refused
             : other)
            .fetch_add(1);
      } catch (const Error& e) {
        // A step older than one the other thread committed meanwhile: refused as it should be.
        if (std::string(e.what()).find("older than the committed step") == std::string::npos) other.fetch_add(1);
      } catch (...) {
        other.fetch_add(1);
      }
    }
  };
  std::thread a(run), b(run);
  a.join();
  b.join();
  m.wait();
  EXPECT_EQ(other.load(), 0);
  EXPECT_GT(saved.load(), 0);
  std::printf("%d saves, %d refused as concurrent\n", saved.load(), refused.load());
}

// Step 2^63-1 committed, but its directory name (19 digits) was not read back as a step.
TEST_F(CheckpointTest, EveryStepUpToTheLargestIsSeen) {
  CheckpointManager m(path("ckpt"));
  for (int64_t step : {int64_t{999999999999999999}, std::numeric_limits<int64_t>::max()}) {
    Checkpoint c(step);
    c.add("x", Array::from_f32({1}, {1}));
    m.save(c);
    EXPECT_EQ(m.latest_step(), step);
    EXPECT_EQ(m.restore(step).step, step);
  }
  EXPECT_EQ(m.steps().size(), 2u);
  // A name past INT64_MAX is no step of ours: ignored, not wrapped around.
  fs::create_directories(m.dir() + "/checkpoint_9223372036854775808");
  testing::write_bytes(m.dir() + "/checkpoint_9223372036854775808/COMMITTED", "step 0\n");
  EXPECT_EQ(m.latest_step(), std::numeric_limits<int64_t>::max());
}

TEST_F(CheckpointTest, MetadataStepMustMatchTheDirectory) {
  CheckpointManager m(path("ckpt"));
  m.save(make_state(10).ckpt);
  m.save(make_state(20).ckpt);
  // A directory renamed: train (latest_step) and eval (info) would disagree about the step.
  fs::rename(m.path(20), m.path(30));
  std::string err = error_of([&] { m.info(30); });
  EXPECT_NE(err.find("says step 20 but its directory is checkpoint_00000030"), std::string::npos) << err;
  EXPECT_NE(err.find("restore_step=10"), std::string::npos) << err;
  EXPECT_EQ(error_of([&] { m.restore(30); }), err);
  fs::rename(m.path(30), m.path(20));
  // The metadata replaced by another step's: the commit marker disagrees too.
  fs::copy_file(m.path(10) + "/metadata.json", m.path(20) + "/metadata.json", fs::copy_options::overwrite_existing);
  err = error_of([&] { m.restore(20); });
  EXPECT_NE(err.find("says step 10 but its directory is checkpoint_00000020"), std::string::npos) << err;
  // Renamed with its metadata edited to match: the commit marker still names the step it committed.
  fs::copy_file(m.path(10) + "/metadata.json", m.path(20) + "/metadata.json", fs::copy_options::overwrite_existing);
  std::string text = testing::read_bytes(m.path(10) + "/metadata.json");
  text.replace(text.find("\"step\": 10"), 11, "\"step\": 40");
  testing::write_bytes(m.path(20) + "/metadata.json", text);
  fs::rename(m.path(20), m.path(40));
  err = error_of([&] { m.restore(40); });
  EXPECT_NE(err.find("COMMITTED commits step 20 but"), std::string::npos) << err;
  // A copy under a name that is not a step directory reads as its metadata says.
  fs::copy(m.path(10), path("exported"), fs::copy_options::recursive);
  EXPECT_EQ(read_checkpoint_info(path("exported")).step, 10);
}

TEST_F(CheckpointTest, OutOfRangeOptionsAreRefusedBeforeAnythingIsWritten) {
  std::string err = error_of([&] { CheckpointManager(path("ckpt"), {.zstd_level = 1000}); });
  EXPECT_NE(err.find("zstd_level 1000 is out of range; use -"), std::string::npos) << err;
  EXPECT_NE(err.find(" .. 22"), std::string::npos) << err;
  EXPECT_THROW(CheckpointManager(path("ckpt"), {.zstd_level = -1000000}), UserError);
  err = error_of([&] { CheckpointManager(path("ckpt"), {.background_nice = 40}); });
  EXPECT_NE(err.find("background_nice 40 is out of range"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(path("ckpt")));
  // The extremes zstd accepts are written and read back.
  for (int level : {zarr::max_zstd_level(), -5}) {
    CheckpointManager m(path("ckpt" + std::to_string(level)), {.zstd_level = level});
    State s = make_state(1);
    m.save(s.ckpt);
    Checkpoint r = m.restore(1);
    for (auto& [name, want] : s.full) EXPECT_TRUE(same_bits(r.full(name), want)) << level << " " << name;
  }
}

TEST_F(CheckpointTest, RestoreOfAnUnknownGroupNamesTheGroups) {
  CheckpointManager m(path("ckpt"));
  m.save(make_state(10).ckpt);
  RestoreOptions o;
  o.group = "param";
  std::string err = error_of([&] { m.restore(10, o); });
  EXPECT_NE(err.find("has no arrays in group 'param'; its groups: 'params', 'opt_state'"), std::string::npos) << err;
  o.group = "opt_state";
  o.only = {"w.f32"};
  err = error_of([&] { m.restore(10, o); });
  EXPECT_NE(err.find("'w.f32', which is in group 'params', not in RestoreOptions::group 'opt_state'"),
            std::string::npos)
      << err;
  o.only = {"mask"};
  EXPECT_EQ(m.restore(10, o).names(), std::vector<std::string>{"mask"});
}

// Array names in metadata.json are directories of the checkpoint: a name that leaves it is refused.
TEST_F(CheckpointTest, MetadataArrayNamesCannotLeaveTheCheckpoint) {
  CheckpointManager m(path("ckpt"));
  m.save(make_state(10).ckpt);
  const std::string meta = m.path(10) + "/metadata.json";
  const std::string text = testing::read_bytes(meta);
  for (const std::string bad : {"../../w.f32", "/etc", "..", "w.f32/../b.f32"}) {
    SCOPED_TRACE(bad);
    std::string t = text;
    t.replace(t.find("\"w.f32\""), 7, "\"" + bad + "\"");
    testing::write_bytes(meta, t);
    std::string err = error_of([&] { m.info(10); });
    EXPECT_NE(err.find("metadata.json: array name '" + bad + "'"), std::string::npos) << err;
    EXPECT_NE(err.find("restore it"), std::string::npos) << err;
  }
  std::string t = text;
  t.replace(t.find("\"w.bf16\""), 8, "\"w.f32\"");
  testing::write_bytes(meta, t);
  EXPECT_NE(error_of([&] { m.info(10); }).find("array 'w.f32' is listed twice"), std::string::npos);
}

// A FIFO opened for reading waits for a writer: every file a restore reads is refused instead.
TEST_F(CheckpointTest, NonRegularFilesAreRefusedNotWaitedOn) {
  CheckpointManager m(path("ckpt"));
  m.save(make_state(10).ckpt);
  const std::string chunk = m.path(10) + "/w.f32/c/1/0";
  fs::remove(chunk);
  ASSERT_EQ(::mkfifo(chunk.c_str(), 0600), 0);
  std::string err = error_of([&] { m.restore(10); });
  EXPECT_NE(err.find("'" + chunk + "' is a FIFO (named pipe), not a regular file"), std::string::npos) << err;
  fs::remove(chunk);
  fs::create_directory(chunk);
  err = error_of([&] { m.restore(10); });
  EXPECT_NE(err.find("'" + chunk + "' is a directory, not a regular file"), std::string::npos) << err;
  const std::string meta = m.path(10) + "/metadata.json";
  fs::remove(meta);
  ASSERT_EQ(::mkfifo(meta.c_str(), 0600), 0);
  err = error_of([&] { m.info(10); });
  EXPECT_NE(err.find("is a FIFO (named pipe)"), std::string::npos) << err;
}

}  // namespace
}  // namespace px
