// The MPI communicator and training over several real processes.
//
// MpiRanks.* run only under mpirun: ctest runs them as the test distributed_mpi_2_ranks
// (mpirun -np 2 with PX_DEVICES=cpu:2 per process: a mesh of 4 devices over 2 processes), and the
// training ones also as distributed_mpi_4x2 and distributed_mpi_8x1 (8 devices as 4 processes of
// 2, and 8 of 1); run alone, they skip. MpiLaunch.* start mpirun themselves (a rank that stops or dies; ranks that
// disagree) and skip when mpirun is missing; MpiFault.* are the programs they launch.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>

#include "core/env.h"
#include "parallax/checkpoint.h"
#include "parallax/communicator.h"
#include "parallax/distributed.h"
#include "parallax/memory.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "sharding/recipe_check.h"
#include "testing.h"

namespace px {
namespace {

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

bool fault_program() { return std::getenv("PX_TEST_MPI_FAULT") != nullptr; }

#define REQUIRE_MPIRUN()                                                                            \
  if (env().launch_size == 0 || fault_program())                                                    \
  GTEST_SKIP() << "runs only under mpirun (ctest runs it as distributed_mpi_2_ranks: mpirun -np 2 " \
                  "--oversubscribe with PX_DEVICES=cpu:2)"

// ---- collectives against the in-process communicator ------------------------------------------

struct Case {
  std::string kind;
  ReduceOp op = ReduceOp::sum;
};

// The bytes of position p's input: the same on every process.
std::vector<std::byte> input_of(int p, int64_t count, DType t, uint32_t salt) {
  Array a = t == DType::i32 ? testing::random_array({count}, t, 7 * p + salt, -50, 50)
                            : testing::random_array({count}, t, 7 * p + salt);
  const auto* b = static_cast<const std::byte*>(a.raw());
  return std::vector<std::byte>(b, b + a.nbytes());
}

// Runs one collective on `comm` over the given positions' buffers (blocking or started + waited).
void run_case(Communicator& comm, const Case& c, const std::vector<int>& positions,
              std::vector<std::vector<std::byte>>& in, std::vector<std::vector<std::byte>>& out, int64_t count, DType t,
              const DeviceGroups& groups, bool start, bool in_place) {
  Buffers ins;
  MutBuffers outs;
  for (int p : positions) {
    ins.push_back(in[p].data());
    outs.push_back(in_place ? in[p].data() : out[p].data());
  }
  const std::vector<std::pair<int, int>> pairs = {{0, 2}, {2, 1}, {1, 3}, {3, 0}};
  if (c.kind == "all_reduce") {
    if (start)
      comm.start_all_reduce(ins, outs, count, t, c.op, groups).wait();
    else
      comm.all_reduce(ins, outs, count, t, c.op, groups);
  } else if (c.kind == "all_gather") {
    if (start)
      comm.start_all_gather(ins, outs, count, t, groups).wait();
    else
      comm.all_gather(ins, outs, count, t, groups);
  } else if (c.kind == "reduce_scatter") {
    if (start)
      comm.start_reduce_scatter(ins, outs, count, t, c.op, groups).wait();
    else
      comm.reduce_scatter(ins, outs, count, t, c.op, groups);
  } else if (c.kind == "all_to_all") {
    if (start)
      comm.start_all_to_all(ins, outs, count, t, groups).wait();
    else
      comm.all_to_all(ins, outs, count, t, groups);
  } else if (c.kind == "permute") {
    if (start)
      comm.start_permute(ins, outs, count, t, pairs).wait();
    else
      comm.permute(ins, outs, count, t, pairs);
  } else {
    comm.broadcast(ins, outs, count, t, 0, groups);  // root: each group's first member
  }
}

TEST(MpiRanks, EveryCollectiveAndDtypeEqualsInProcessOnUnevenGroups) {
  REQUIRE_MPIRUN();
  const ProcessWorld& w = process_world();
  ASSERT_NE(w.communicator, nullptr);
  Communicator& comm = *w.communicator;
  const int world = static_cast<int>(comm.world_size());
  ASSERT_EQ(world, 4) << "the test expects 2 processes with PX_DEVICES=cpu:2";
  EXPECT_EQ(comm.local_positions(), (std::vector<int>{2 * w.rank, 2 * w.rank + 1}));
  auto inproc = make_inproc_communicator(world);
  std::vector<int> all(world);
  for (int p = 0; p < world; ++p) all[p] = p;
  comm.reset_stats();
  const std::vector<DeviceGroups> layouts = {
      {{0, 1, 2, 3}},    // everyone
      {{0, 2}, {1, 3}},  // across the processes
      {{3, 0, 1}, {2}},  // uneven, out of order, one group inside a process
      {{0, 1}, {2, 3}},  // inside the processes: no message
  };
  const std::vector<Case> cases = {
      {"all_reduce"}, {"all_reduce", ReduceOp::max}, {"all_gather"}, {"reduce_scatter"}, {"all_to_all"}, {"permute"},
      {"broadcast"}};
  uint32_t salt = 1;
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32})
    for (const DeviceGroups& groups : layouts)
      for (const Case& c : cases)
        for (int variant = 0; variant < 3; ++variant) {
          const bool start = variant == 1, in_place = variant == 2 && c.kind == "all_reduce";
          if (variant == 2 && !in_place) continue;
          const int64_t count = (variant == 1 && t == DType::f32) ? 12 * 5000 : 12 * 25;
          const int64_t es = dtype_size(t);
          std::vector<std::vector<std::byte>> in(world),
              out(world, std::vector<std::byte>(count * world * es, std::byte{0xAB}));
          for (int p = 0; p < world; ++p) in[p] = input_of(p, count, t, ++salt);
          auto ref_in = in;
          auto ref_out = out;
          run_case(*inproc, c, all, ref_in, ref_out, count, t, groups, false, in_place);
          run_case(comm, c, comm.local_positions(), in, out, count, t, groups, start, in_place);
          for (int p : comm.local_positions()) {
            const bool same = in_place ? in[p] == ref_in[p] : out[p] == ref_out[p];
            EXPECT_TRUE(same) << c.kind << " " << dtype_name(t) << (start ? " started" : "")
                              << (in_place ? " in place" : "") << " groups #" << (&groups - layouts.data())
                              << " position " << p;
          }
        }
  // The byte counters are those of the in-process communicator for this process's positions.
  for (int p : comm.local_positions())
    for (int k = 0; k < kNumCollectiveKinds; ++k) {
      auto kind = static_cast<CollectiveKind>(k);
      EXPECT_EQ(comm.stats().at(p, kind).calls, inproc->stats().at(p, kind).calls) << collective_name(kind);
      EXPECT_EQ(comm.stats().at(p, kind).wire_bytes, inproc->stats().at(p, kind).wire_bytes) << collective_name(kind);
      EXPECT_EQ(comm.stats().at(p, kind).payload_bytes, inproc->stats().at(p, kind).payload_bytes);
    }
  comm.barrier();
}

// A started all-reduce runs while this process computes: started, compute, then wait.
TEST(MpiRanks, StartedCollectivesOverlapCompute) {
  REQUIRE_MPIRUN();
  Communicator& comm = *process_world().communicator;
  const int64_t count = 1 << 20;
  std::vector<std::vector<float>> in(2, std::vector<float>(count, 1.0f)), out(2, std::vector<float>(count));
  Buffers ins{in[0].data(), in[1].data()};
  MutBuffers outs{out[0].data(), out[1].data()};
  double alone = 1e9;
  for (int rep = 0; rep < 4; ++rep) {  // the best of 4: the first pays for page faults
    comm.barrier();
    auto t0 = std::chrono::steady_clock::now();
    comm.all_reduce(ins, outs, count, DType::f32, ReduceOp::sum, {{0, 1, 2, 3}});
    alone = std::min(alone, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Started, then 2x its time of compute on this thread, then waited: the wait is short when the
  // progress thread moved the bytes meanwhile.
  comm.barrier();
  auto t1 = std::chrono::steady_clock::now();
  CollectiveHandle h = comm.start_all_reduce(ins, outs, count, DType::f32, ReduceOp::sum, {{0, 1, 2, 3}});
  EXPECT_TRUE(h.pending());
  volatile double sink = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() < 2 * alone) sink = sink + 1;
  auto t2 = std::chrono::steady_clock::now();
  h.wait();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t2).count();
  EXPECT_FALSE(h.pending());
  EXPECT_EQ(out[1][count - 1], 4.0f);
  if (process_world().rank == 0)
    std::printf(
        "all_reduce of %lld MiB f32 over 2 processes x 2 devices: %.2f ms (%.2f GB/s of payload); "
        "started, computed %.2f ms, then waited %.2f ms\n",
        static_cast<long long>(count * 4 >> 20), alone * 1e3, count * 4 / alone / 1e9, 2 * alone * 1e3, waited * 1e3);
}

TEST(MpiRanks, ProcessWorldSpansEveryProcessDevices) {
  REQUIRE_MPIRUN();
  const ProcessWorld& w = process_world();
  EXPECT_EQ(w.size, 2);
  EXPECT_EQ(w.devices, (DeviceSet{"cpu", 4, 2}));
  EXPECT_EQ(w.hosts.size(), 2u);
  EXPECT_EQ(w.launcher, "mpirun");
  Mesh mesh = Mesh::create({{"data", -1}}, w.devices);
  EXPECT_EQ(mesh.local_positions(w.rank), (std::vector<int>{2 * w.rank, 2 * w.rank + 1}));
  // The same text everywhere passes; a different one fails on every rank, naming the difference.
  check_same_on_every_process(*w.communicator, w.rank, "configs", "model: gpt\nsteps: 10\n");
  std::string err = testing::error_of([&] {
    check_same_on_every_process(*w.communicator, w.rank, "configs",
                                w.rank == 0 ? "model: gpt\nsteps: 10\n" : "model: gpt\nsteps: 12\n");
  });
  EXPECT_TRUE(has(err, "different configs")) << err;
  EXPECT_TRUE(has(err, "'steps: 12' against 'steps: 10'")) << err;
  EXPECT_TRUE(has(err, "rank 1 differs from rank 0")) << err;
}

// ---- training over 2 processes equals 1 process -------------------------------------------------

// The step over the processes first (every rank), then, on rank 0 alone, the same step in this
// one process over all the devices: losses, gradient norms and the gathered params must be equal.
// (Every rank's losses and gathered params are the same collective results; rank 0 checks them,
// so that 8 ranks do not each run the 8-device reference.)
void check_training(const std::vector<std::pair<std::string, int64_t>>& axes, ShardingStrategy strategy,
                    bool save = false, const nn::LmConfig& cfg = recipe_check::gpt_micro()) {
  using namespace recipe_check;
  using clock = std::chrono::steady_clock;
  const ProcessWorld& w = process_world();
  const int steps = 2;
  Mesh single = Mesh::create(axes, DeviceSet{w.devices.platform, w.devices.count, 1});
  Mesh split = Mesh::create(axes, w.devices);
  ShardingOptions sopt;
  sopt.device_parallelism = DeviceParallelism::over_devices;
  // AUTO: a preset cluster, so that the reference solve below finds the plan the first process found.
  sopt.auto_cluster = "h100x8";
  // ... and time for the whole search: under load (8 processes, or the sanitizer build, on 2 cores)
  // a 10 s limit can cut it short on one side and not the other. Below PX_COLLECTIVE_TIMEOUT_S (120).
  sopt.auto_time_limit_s = 100;
  double ref_time = 0, split_time = 0;  // the last step (the first compiles)

  Fixture pf(cfg);
  ShardingOptions o = sopt;
  o.communicator = w.communicator;
  TrainStep step(pf.model.store(), opt(), pf.loss, pf.batch_types, px::testing::on_mesh(split, strategy, o));
  ASSERT_EQ(step.process(), w.rank);
  TrainState s = step.init(0);
  const std::string what = std::string(strategy_name(strategy)) + " on " + split.to_string();
  std::vector<StepMetrics> got_metrics;
  for (int i = 0; i < steps; ++i) {
    auto t0 = clock::now();
    got_metrics.push_back(step(s, pf.batch(i)));
    split_time = std::chrono::duration<double>(clock::now() - t0).count();
  }
  std::vector<Array> got = step.gather_params(s);
  // One plan everywhere (AUTO: solved by the process holding position 0 alone).
  std::string specs;
  for (const auto& p : step.plan().params) specs += p.path + " " + p.spec.to_string() + "\n";
  check_same_on_every_process(*w.communicator, w.rank, "plans", specs + step.plan().explanation);
  if (save) {
    // Every process writes its own shards of one checkpoint (rank 0 commits) and reads them back.
    const char* job = std::getenv("PMIX_NAMESPACE");  // the same on every rank of this job
    const std::string dir =
        (std::filesystem::temp_directory_path() / ("px_mpi_ckpt_" + std::string(job ? job : "0"))).string();
    if (w.rank == 0) {
      std::filesystem::remove_all(dir);
      std::filesystem::create_directories(dir);
    }
    w.communicator->barrier();
    step.save(dir + "/state", s);
    TrainState l = step.load(dir + "/state");
    for (size_t i = 0; i < s.params.size(); ++i) {
      ASSERT_EQ(l.params[i].shards().size(), s.params[i].shards().size());
      for (size_t j = 0; j < s.params[i].shards().size(); ++j)
        EXPECT_EQ(l.params[i].shards()[j].to_f32(), s.params[i].shards()[j].to_f32()) << "param " << i;
    }
    w.communicator->barrier();
    if (w.rank == 0) std::filesystem::remove_all(dir);
  }
  if (w.rank != 0) return;

  Fixture f(cfg);
  TrainStep ref(f.model.store(), opt(), f.loss, f.batch_types, px::testing::on_mesh(single, strategy, sopt));
  for (size_t i = 0; i < ref.plan().params.size(); ++i)
    EXPECT_EQ(ref.plan().params[i].spec, step.plan().params[i].spec) << what << " " << ref.plan().params[i].path;
  TrainState rs = ref.init(0);
  for (int i = 0; i < steps; ++i) {
    auto t0 = clock::now();
    StepMetrics want = ref(rs, f.batch(i));
    ref_time = std::chrono::duration<double>(clock::now() - t0).count();
    EXPECT_EQ(got_metrics[i].loss, want.loss) << what << " step " << i;
    EXPECT_EQ(got_metrics[i].grad_norm, want.grad_norm) << what << " step " << i;
  }
  std::vector<Array> want_params = ref.gather_params(rs);
  ASSERT_EQ(got.size(), want_params.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].to_f32(), want_params[i].to_f32()) << what << " param " << i;
  std::printf("%s %s step: %.1f ms over %d processes, %.1f ms in one process (%s)\n", cfg.name.c_str(), what.c_str(),
              split_time * 1e3, w.size, ref_time * 1e3, single.to_string().c_str());
}

// init(seed) under FSDP over the processes: each process generates only its own shards (its host
// peak during init is what it keeps plus one param being generated), bitwise the unsharded init.
TEST(MpiRanks, InitHoldsOnlyThisProcessShardsBitwise) {
  REQUIRE_MPIRUN();
  using namespace recipe_check;
  const ProcessWorld& w = process_world();
  Fixture f(gpt_micro());
  ShardingOptions o;
  o.communicator = w.communicator;
  const Mesh mesh = Mesh::create({{"data", -1}}, w.devices);
  TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, px::testing::on_mesh(mesh, ShardingStrategy::FSDP, o));
  int64_t largest = 0, whole = 0;
  for (const TensorType& t : f.model.store().types()) {
    largest = std::max(largest, numel(t.shape) * 4);
    whole += t.nbytes();
  }
  const int64_t before = platform_memory_stats("cpu").bytes_in_use;
  reset_platform_peak_memory("cpu");
  TrainState s = step.init(5);
  const MemoryStats after = platform_memory_stats("cpu");
  const int64_t held = after.bytes_in_use - before;
  EXPECT_LE(after.peak_bytes_in_use - before, held + largest) << "rank " << w.rank;
  if (w.size > 1) EXPECT_LT(held, 3 * whole) << "rank " << w.rank << " holds more than its shards";
  const std::vector<Array> want = f.model.store().init(5);
  for (size_t i = 0; i < s.params.size(); ++i)
    for (int pos : s.params[i].positions()) {
      const Array& got = s.params[i].shard(pos);
      Array box(got.dtype(), got.shape());
      const std::vector<int64_t> at = s.params[i].sharding().shard_offsets(want[i].shape(), pos);
      nn::init_box(f.model.store().spec(static_cast<int>(i)), 5, at, box);
      EXPECT_EQ(std::memcmp(got.raw(), box.raw(), static_cast<size_t>(box.nbytes())), 0) << "param " << i;
    }
  const std::vector<Array> got = step.gather_params(s);  // a collective: every rank calls it
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_EQ(std::memcmp(got[i].raw(), want[i].raw(), static_cast<size_t>(want[i].nbytes())), 0) << "param " << i;
}

TEST(MpiRanks, DdpOverTwoProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  check_training({{"data", -1}}, ShardingStrategy::DDP, /*save=*/true);
}
TEST(MpiRanks, FsdpOverTwoProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  check_training({{"data", -1}}, ShardingStrategy::FSDP);
}
TEST(MpiRanks, TpAcrossProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  // The model axis (at most 4: the model's heads) spans processes.
  if (process_world().devices.count <= 4)
    check_training({{"model", -1}}, ShardingStrategy::TP);
  else
    check_training({{"data", -1}, {"model", 4}}, ShardingStrategy::TP);
}
TEST(MpiRanks, LlamaFsdpTpOverProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  check_training({{"data", -1}, {"model", 2}}, ShardingStrategy::FSDP_TP, false, recipe_check::llama_micro());
}
TEST(MpiRanks, FsdpTpOverTwoProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  check_training({{"data", -1}, {"model", 2}}, ShardingStrategy::FSDP_TP);
}

TEST(MpiRanks, AutoOverProcessesEqualsOneProcessBitwise) {
  REQUIRE_MPIRUN();
  check_training({{"data", -1}, {"model", 2}}, ShardingStrategy::AUTO);
}

// Pipeline stages in different processes: stage:S over the S processes (each holding one stage's
// devices over `data`), 1F1B with 2S microbatches, 20 steps of GPT and Llama equal to the same
// pipeline in one process; the state gathered and saved by the processes (the first writes it,
// fetched from each stage) is the one process's.
void check_pipeline(const nn::LmConfig& cfg, int microbatches) {
  using namespace recipe_check;
  const ProcessWorld& w = process_world();
  const int S = w.size, steps = 20;
  const int64_t per = w.devices.count / w.size;  // devices per process
  std::vector<std::pair<std::string, int64_t>> axes = {{"stage", S}};
  if (per > 1) axes.push_back({"data", per});
  TrainStepOptions o;
  o.microbatches = microbatches;
  o.clip_norm = 1.0;
  o.mesh = Mesh::create(axes, w.devices);
  o.sharding.communicator = w.communicator;
  Fixture pf(cfg, per * microbatches);
  TrainStep step(pf.model.store(), opt(), pf.loss, pf.batch_types, o);
  ASSERT_TRUE(step.pipelined());
  TrainState s = step.init(0);
  std::vector<StepMetrics> got;
  for (int i = 0; i < steps; ++i) got.push_back(step(s, pf.batch(i)));
  const std::vector<Array> params = step.gather_params(s);
  const char* job = std::getenv("PMIX_NAMESPACE");
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("px_mpi_pipeline_" + std::string(job ? job : "0"))).string();
  if (w.rank == 0) std::filesystem::remove_all(dir);
  w.communicator->barrier();
  step.save(dir, s);
  const std::vector<Array> loaded = step.gather_params(step.load(dir));
  w.communicator->barrier();
  if (w.rank == 0) std::filesystem::remove_all(dir);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(loaded[i].to_f32(), params[i].to_f32()) << "loaded param " << i;
  if (w.rank != 0) return;

  Fixture f(cfg, per * microbatches);
  TrainStepOptions one = o;
  one.mesh = Mesh::create(axes, DeviceSet{w.devices.platform, w.devices.count, 1});
  one.sharding.communicator = nullptr;
  TrainStep ref(f.model.store(), opt(), f.loss, f.batch_types, one);
  TrainState rs = ref.init(0);
  for (int i = 0; i < steps; ++i) {
    const StepMetrics want = ref(rs, f.batch(i));
    EXPECT_NEAR(got[i].loss, want.loss, 1e-6 * std::abs(want.loss)) << cfg.name << " step " << i;
    EXPECT_NEAR(got[i].grad_norm, want.grad_norm, 1e-6 * std::abs(want.grad_norm)) << cfg.name << " step " << i;
  }
  const std::vector<Array> want = ref.gather_params(rs);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(testing::all_close(params[i].to_f32(), want[i].to_f32(), 1e-6, 1e-6)) << cfg.name << " param " << i;
  std::printf("pipeline %s %s over %d processes, %d steps: equal to one process\n", cfg.name.c_str(),
              one.mesh->to_string().c_str(), w.size, steps);
}

TEST(MpiRanks, PipelineOverProcessesEqualsOneProcess) {
  REQUIRE_MPIRUN();
  const int S = process_world().size;
  check_pipeline(nn::gpt2_config("gpt_pipe", 256, 64, 4, 2 * S, 128, 16), 2 * S);
  check_pipeline(nn::llama_config("llama_pipe", 256, 64, 4, 2, 2 * S, 96, 16), 2 * S);
}

// Each process holds only its stages' state, from init on: stage:S over the S processes, each
// process's high-water mark (init, compile and 20 steps) at most 1.4 / S of the same pipeline's in
// one process (S <= 4), and the training bitwise the one process's. The state saved by the
// processes (each its own stages' shards) resumes onto another split: 2S stages, two per process.
TEST(MpiRanks, PipelineStateIsSplitOverTheProcessesBitwise) {
  REQUIRE_MPIRUN();
  using namespace recipe_check;
  const ProcessWorld& w = process_world();
  const int S = w.size, M = 2 * S, steps = 20;
  const int64_t per = w.devices.count / w.size;
  const nn::LmConfig cfg = nn::gpt2_config("gpt_pipe", 256, 128, 4, 2 * S, 256, 16);
  std::vector<std::pair<std::string, int64_t>> axes = {{"stage", S}};
  if (per > 1) axes.push_back({"data", per});
  TrainStepOptions o;
  o.microbatches = M;
  o.mesh = Mesh::create(axes, w.devices);
  o.sharding.communicator = w.communicator;
  // Every process's peak over its run, above what it held before.
  auto measured = [](const std::function<void()>& run) {
    const int64_t before = platform_memory_stats("cpu").bytes_in_use;
    reset_platform_peak_memory("cpu");
    run();
    return platform_memory_stats("cpu").peak_bytes_in_use - before;
  };
  Fixture pf(cfg, per * M);
  std::vector<StepMetrics> got;
  std::vector<Array> params;
  const char* job = std::getenv("PMIX_NAMESPACE");
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("px_mpi_stages_" + std::string(job ? job : "0"))).string();
  if (w.rank == 0) std::filesystem::remove_all(dir);
  w.communicator->barrier();
  const int64_t peak = measured([&] {
    TrainStep step(pf.model.store(), opt(), pf.loss, pf.batch_types, o);
    TrainState s = step.init(0);
    // Only this process's stages: nothing of another stage's params is held here.
    for (size_t i = 0; i < s.params.size(); ++i)
      if (s.params[i].shards().empty()) EXPECT_TRUE(s.params[i].positions().empty()) << i;
    for (int i = 0; i < steps; ++i) got.push_back(step(s, pf.batch(i)));
    params = step.gather_params(s);
    step.save(dir, s);
  });
  // Resumed onto 2S stages, two per process (where a process has two devices to give them).
  if (per % 2 == 0) {
    std::vector<std::pair<std::string, int64_t>> axes2 = {{"stage", 2 * S}};
    if (per > 2) axes2.push_back({"data", per / 2});
    TrainStepOptions o2 = o;
    o2.mesh = Mesh::create(axes2, w.devices);
    TrainStep step2(pf.model.store(), opt(), pf.loss, pf.batch_types, o2);
    const TrainState l = step2.load(dir);
    const std::vector<Array> loaded = step2.gather_params(l);
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(loaded[i].to_f32(), params[i].to_f32()) << "param " << i << " resumed on " << o2.mesh->to_string();
  }
  w.communicator->barrier();
  if (w.rank == 0) std::filesystem::remove_all(dir);
  // Every process's peak to the first, which compares them with one process's.
  std::vector<int64_t> peaks(static_cast<size_t>(w.size), peak);
  if (w.rank != 0) w.communicator->send(0, 4242, &peaks[0], sizeof(int64_t));
  for (int q = 1; q < w.size && w.rank == 0; ++q) w.communicator->receive(q, 4242, &peaks[q], sizeof(int64_t));
  w.communicator->barrier();  // received before any process moves on (or exits)
  if (w.rank != 0) return;

  Fixture f(cfg, per * M);
  TrainStepOptions one = o;
  one.mesh = Mesh::create(axes, DeviceSet{w.devices.platform, w.devices.count, 1});
  one.sharding.communicator = nullptr;
  std::vector<Array> want;
  const int64_t one_peak = measured([&] {
    TrainStep ref(f.model.store(), opt(), f.loss, f.batch_types, one);
    TrainState rs = ref.init(0);
    for (int i = 0; i < steps; ++i) {
      const StepMetrics m = ref(rs, f.batch(i));
      EXPECT_EQ(got[i].loss, m.loss) << "step " << i;
      EXPECT_EQ(got[i].grad_norm, m.grad_norm) << "step " << i;
    }
    want = ref.gather_params(rs);
  });
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(params[i].to_f32(), want[i].to_f32()) << "param " << i;
  for (int q = 0; q < w.size; ++q) {
    const double ratio = static_cast<double>(peaks[q]) / static_cast<double>(one_peak);
    std::printf("pipeline stage:%d over %d processes: process %d's peak %lld bytes, %.3f of one process's %lld\n", S,
                w.size, q, static_cast<long long>(peaks[q]), ratio, static_cast<long long>(one_peak));
    if (S <= 4) EXPECT_LE(ratio, 1.4 / S) << "process " << q;
  }
}

// The text of the process holding position 0 reaches every process, whatever the others pass.
TEST(MpiRanks, SharedTextComesFromTheFirstProcess) {
  REQUIRE_MPIRUN();
  const ProcessWorld& w = process_world();
  std::string big(100001, 'x');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + (i * 7) % 26);
  EXPECT_EQ(share_from_first_process(*w.communicator, w.rank == 0 ? "from rank 0" : "rank " + std::to_string(w.rank)),
            "from rank 0");
  EXPECT_EQ(share_from_first_process(*w.communicator, w.rank == 0 ? "" : "not empty"), "");
  EXPECT_EQ(share_from_first_process(*w.communicator, w.rank == 0 ? big : "short"), big);
}

// jit with AUTO over the processes: only the first process solves (the others are given a cluster
// that does not exist, which a solve would reject), and the outputs equal the function's own.
TEST(MpiRanks, JitAutoOverProcessesSolvesOnceAndEqualsOneDevice) {
  REQUIRE_MPIRUN();
  const ProcessWorld& w = process_world();
  Mesh mesh = Mesh::create({{"data", -1}}, w.devices);
  auto fn = [](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    return std::vector<Tensor>{matmul(gelu(matmul(args[0], params[0])), params[1])};
  };
  const int64_t n = w.devices.count;
  const std::vector<TensorType> pt{{DType::f32, {16, 32}}, {DType::f32, {32, 8}}}, at{{DType::f32, {4 * n, 16}}};
  Array w1 = testing::random_array({16, 32}, DType::f32, 2), w2 = testing::random_array({32, 8}, DType::f32, 3);
  Array x = testing::random_array({4 * n, 16}, DType::f32, 4);
  ShardingOptions o;
  o.communicator = w.communicator;
  o.auto_cluster = w.rank == 0 ? "h100x8" : "no-such-cluster";
  auto f = jit(fn, ShardingStrategy::AUTO, pt, {"w1", "w2"}, at, mesh, o);
  EXPECT_EQ(f->plan().strategy, ShardingStrategy::AUTO);
  Array got = (*f)({w1, w2}, {x})[0];
  auto one = jit(fn, ShardingStrategy::DDP, pt, {"w1", "w2"}, at, Mesh::cpu({{"data", 1}}));
  EXPECT_TRUE(testing::all_close(got.to_f32(), (*one)({w1, w2}, {x})[0].to_f32(), 1e-5, 1e-5));
  // A time limit the others could not wait for is refused on every process, before any solve.
  o.auto_time_limit_s = 1e9;
  std::string err = testing::error_of([&] { jit(fn, ShardingStrategy::AUTO, pt, {"w1", "w2"}, at, mesh, o); });
  EXPECT_TRUE(has(err, "PX_COLLECTIVE_TIMEOUT_S")) << err;
}

// ---- the launcher's variables and the timeout (no MPI needed) ----------------------------------

EnvConfig env_of(const std::map<std::string, std::string>& vars) {
  return parse_env([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

TEST(MpiEnv, LaunchersAndTimeoutAreRead) {
  EnvConfig none = env_of({});
  EXPECT_EQ(none.launch_size, 0);
  EXPECT_EQ(none.launcher, "");
  EXPECT_EQ(none.collective_timeout_s, 60);
  EnvConfig m = env_of({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(m.launch_rank, 1);
  EXPECT_EQ(m.launch_size, 4);
  EXPECT_EQ(m.launcher, "mpirun");
  // Slurm's variables count inside a job step (srun) only, not in the batch script's shell.
  EXPECT_EQ(env_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "8"}}).launch_size, 0);
  EnvConfig sr = env_of({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "8"}, {"SLURM_STEP_ID", "0"}});
  EXPECT_EQ(sr.launch_rank, 3);
  EXPECT_EQ(sr.launcher, "srun");
  EXPECT_EQ(env_of({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}}).launch_size, 0);  // not a rank
  EXPECT_EQ(env_of({{"PX_COLLECTIVE_TIMEOUT_S", "2.5"}}).collective_timeout_s, 2.5);
  for (const char* bad : {"0", "-1", "x", "10s"}) {
    std::string err = testing::error_of([&] { env_of({{"PX_COLLECTIVE_TIMEOUT_S", bad}}); });
    EXPECT_EQ(err, std::string("[env] PX_COLLECTIVE_TIMEOUT_S='") + bad +
                       "' is not a timeout; use a number of seconds > 0, e.g. 60");
  }
}

// ---- faults and bad launches: mpirun started from the test ---------------------------------------

std::string mpirun_path() {
#ifdef PX_MPIEXEC
  if (std::filesystem::exists(PX_MPIEXEC)) return PX_MPIEXEC;
#endif
  return "";
}

struct Launch {
  int status = -1;
  double seconds = 0;
  std::string output;
};

// mpirun -np 2 <this test binary> --gtest_filter=<filter>, with the given environment.
Launch launch(const std::string& filter, const std::string& env_vars) {
  const std::string cmd = env_vars + " OMP_NUM_THREADS=1 " + mpirun_path() +
                          " -np 2 --oversubscribe --allow-run-as-root --mca btl self,vader"
                          " --mca btl_vader_single_copy_mechanism none " +
                          "/proc/" + std::to_string(::getpid()) + "/exe --gtest_filter=" + filter + " 2>&1";
  Launch l;
  auto t0 = std::chrono::steady_clock::now();
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return l;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), f)) l.output.append(buf, n);
  l.status = ::pclose(f);
  l.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return l;
}

#define REQUIRE_LAUNCHER()                                                                  \
  if (env().launch_size != 0) GTEST_SKIP() << "starts mpirun itself; not run under mpirun"; \
  if (mpirun_path().empty()) GTEST_SKIP() << "mpirun (openmpi-bin) is not installed: no multi-process test"

// Rank 1 stops (SIGSTOP) before an all-reduce: rank 0 fails with the timeout error naming rank 1,
// and the job ends (non-zero) well within the timeout plus start-up.
TEST(MpiLaunch, AStoppedRankFailsTheOthersWithinTheTimeout) {
  REQUIRE_LAUNCHER();
  Launch l = launch("MpiFault.StopOrDie", "PX_TEST_MPI_FAULT=stop PX_DEVICES=cpu:1 PX_COLLECTIVE_TIMEOUT_S=2");
  EXPECT_NE(l.status, 0) << l.output;
  EXPECT_LT(l.seconds, 20) << l.output;
  EXPECT_TRUE(has(l.output, "[mpi] rank 0: all_reduce #")) << l.output;
  EXPECT_TRUE(has(l.output, "timed out after 2 s: rank 1 (host ")) << l.output;
  EXPECT_TRUE(has(l.output, "sent nothing")) << l.output;
}

// Rank 1 dies (SIGKILL) mid-run: the job ends with rank 1 named, within seconds.
TEST(MpiLaunch, AKilledRankEndsTheJobNamingIt) {
  REQUIRE_LAUNCHER();
  Launch l = launch("MpiFault.StopOrDie", "PX_TEST_MPI_FAULT=kill PX_DEVICES=cpu:1 PX_COLLECTIVE_TIMEOUT_S=10");
  EXPECT_NE(l.status, 0) << l.output;
  EXPECT_LT(l.seconds, 20) << l.output;
  EXPECT_TRUE(has(l.output, "rank 1")) << l.output;
}

// Processes launched with different device counts fail at start, naming both.
TEST(MpiLaunch, DifferentDeviceCountsFailAtStart) {
  REQUIRE_LAUNCHER();
  Launch l = launch("MpiFault.StopOrDie", "PX_TEST_MPI_FAULT=devices");
  EXPECT_NE(l.status, 0) << l.output;
  EXPECT_TRUE(has(l.output, "rank 1 (host ")) << l.output;
  EXPECT_TRUE(has(l.output, "PX_DEVICES=cpu:2) but rank 0")) << l.output;
}

// The program the launch tests run on each rank.
TEST(MpiFault, StopOrDie) {
  const char* mode = std::getenv("PX_TEST_MPI_FAULT");
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  // Before anything reads the environment (env() is read once): rank 1 asks for more devices.
  if (mode && rank && std::string(mode) == "devices") ::setenv("PX_DEVICES", *rank == '1' ? "cpu:2" : "cpu:1", 1);
  if (!mode || env().launch_size == 0) GTEST_SKIP() << "run by the MpiLaunch tests under mpirun";
  const std::string m = mode;
  if (m == "devices") {
    // Rank 1 has cpu:2, rank 0 cpu:1: process_world() must refuse on both.
    std::string err = testing::error_of([] { process_world(); });
    std::printf("rank error: %s\n", err.c_str());
    std::fflush(stdout);
    std::_Exit(err.empty() ? 0 : 3);
  }
  const ProcessWorld& w = process_world();
  Communicator& comm = *w.communicator;
  std::vector<float> x(1000, 1.0f), y(1000);
  comm.all_reduce({x.data()}, {y.data()}, 1000, DType::f32, ReduceOp::sum, {{0, 1}});
  if (w.rank == 1) ::raise(m == "stop" ? SIGSTOP : SIGKILL);
  std::string err = testing::error_of([&] {
    comm.all_reduce({x.data()}, {y.data()}, 1000, DType::f32, ReduceOp::sum, {{0, 1}});
  });
  std::printf("rank %d error: %s\n", w.rank, err.c_str());
  std::fflush(stdout);
  // A later call fails at once with the same error.
  std::string again = testing::error_of([&] { comm.barrier(); });
  EXPECT_EQ(again, err);
  std::exit(err.empty() ? 0 : 2);  // the exit handler aborts the job (rank 1 is stopped)
}

}  // namespace
}  // namespace px
