// Meshes over several processes: each position knows its process, a sharded array holds only its
// process's shards, and DDP / FSDP steps run as 2 "processes" (threads with their own
// communicators, executables and shards) give bitwise the single-process results.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "distributed/threaded.h"
#include "parallax/checkpoint.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"
#include "recipe_check.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A fresh directory for one test.
std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / ("px_procs_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

std::vector<std::vector<float>> local_values(const ShardedArray& a) {
  std::vector<std::vector<float>> v;
  for (const Array& s : a.shards()) v.push_back(s.to_f32());
  return v;
}

TEST(Processes, MeshPositionsKnowTheirProcess) {
  Mesh one = Mesh::cpu({{"data", 4}, {"model", 2}});
  EXPECT_EQ(one.num_processes(), 1);
  EXPECT_EQ(one.local_positions(0).size(), 8u);
  EXPECT_EQ(one.process_of(7), 0);
  EXPECT_EQ(one.local_index(5), 5);

  Mesh two = one.with_processes(2);
  EXPECT_EQ(two.num_processes(), 2);
  EXPECT_EQ(two.local_positions(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(two.local_positions(1), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(two.process_of(5), 1);
  EXPECT_EQ(two.local_index(5), 1);
  EXPECT_EQ(two.device_ids()[5], 5);  // the global id
  EXPECT_EQ(two.to_string(), "Mesh{data: 4, model: 2} on cpu:8 over 2 processes");
  EXPECT_NE(one, two);
  EXPECT_EQ(two, one.with_processes(2));
  EXPECT_EQ(one, one.with_processes(1));

  // Any assignment, e.g. interleaved.
  Mesh odd = Mesh::cpu({{"data", 4}}).with_process_of({0, 1, 0, 1});
  EXPECT_EQ(odd.local_positions(1), (std::vector<int>{1, 3}));
  EXPECT_EQ(odd.local_index(3), 1);

  // "cpu:4 over 2 processes" as a device set.
  DeviceSet ds{"cpu", 4, 2};
  EXPECT_EQ(ds.to_string(), "cpu:4 over 2 processes");
  EXPECT_EQ(Mesh::create({{"data", -1}}, ds), Mesh::cpu({{"data", 4}}).with_processes(2));

  EXPECT_TRUE(has(error_of([&] { one.with_processes(3); }), "cannot be split over 3 processes"));
  EXPECT_TRUE(has(error_of([&] { one.with_process_of({0, 2, 0, 2, 0, 2, 0, 2}); }), "process 1 holds no position"));
  EXPECT_TRUE(has(error_of([&] { two.local_positions(2); }), "process 2 is not one of the 2 process(es)"));
}

TEST(Processes, ArraysHoldOnlyTheirProcessShards) {
  Mesh mesh = Mesh::cpu({{"data", 4}}).with_processes(2);
  Array full = testing::random_array({8, 3});
  Sharding rows(mesh, PartitionSpec{"data"});
  ShardedArray a1 = shard(full, rows, 1);
  EXPECT_EQ(a1.process(), 1);
  EXPECT_EQ(a1.positions(), (std::vector<int>{2, 3}));
  ASSERT_EQ(a1.shards().size(), 2u);
  EXPECT_TRUE(a1.holds(3));
  EXPECT_FALSE(a1.holds(0));
  // Position 3 holds rows 6..7.
  std::vector<float> f = full.to_f32(), s3 = a1.shard(3).to_f32();
  EXPECT_EQ(s3, std::vector<float>(f.begin() + 18, f.end()));
  EXPECT_EQ(a1.shard(3).placement().device, 3);

  // A remote shard is an error that says where it lives and what to do.
  std::string err = error_of([&] { a1.shard(0); });
  EXPECT_TRUE(has(err, "mesh position 0 lives in process 0")) << err;
  EXPECT_TRUE(has(err, "holds only positions 2, 3")) << err;
  EXPECT_TRUE(has(err, "px::gather(array, communicator)")) << err;
  EXPECT_TRUE(has(error_of([&] { a1.shard(9); }), "mesh position 9 is not in")) << err;
  // Gathering needs the other process's shards: a clear error without a communicator...
  err = error_of([&] { gather(a1); });
  EXPECT_TRUE(has(err, "holds only the shards of process 1")) << err;
  EXPECT_TRUE(has(err, "px::gather(array, communicator)")) << err;
  EXPECT_TRUE(has(error_of([&] { shard(full, rows, 2); }), "process 2 is not one of the 2 process(es)"));
  EXPECT_TRUE(has(error_of([&] { ShardedArray(full.type(), rows, {a1.shards()[0]}, 1); }),
                  "needs 2 shards in process 1 (positions 2, 3), got 1"));

  // ...and a collective with one. Partial sums are summed in the same order as in one process.
  Mesh m2 = Mesh::cpu({{"data", 2}, {"model", 2}}).with_processes(2);
  Sharding partial(m2, PartitionSpec{"data"}, {"model"});
  Array one_process =
      gather(shard(full, Sharding(Mesh::cpu({{"data", 2}, {"model", 2}}), PartitionSpec{"data"}, {"model"})));
  auto world = make_threaded_world(m2.process_layout());
  std::vector<Array> got(2), got_rows(2);
  world->run([&](int p, Communicator& comm) {
    got[p] = gather(shard(full, partial, p), comm);
    got_rows[p] = gather(shard(full, rows, p), comm);
  });
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(got[p].to_f32(), one_process.to_f32()) << "process " << p;
    EXPECT_EQ(got_rows[p].to_f32(), f) << "process " << p;
  }
}

TEST(Processes, ExecutableNeedsThisProcessCommunicatorAndShards) {
  Mesh mesh = Mesh::cpu({{"data", 4}}).with_processes(2);
  auto g =
      trace([](const std::vector<Tensor>& x) { return std::vector<Tensor>{sum(x[0] * x[0])}; }, {{DType::f32, {8, 3}}});
  auto program = [&] { return partition(*g, mesh, {Sharding(mesh, PartitionSpec{"data"})}); };
  std::string err = error_of([&] { ShardedExecutable::compile(program()); });
  EXPECT_TRUE(has(err, "spans several processes")) << err;
  EXPECT_TRUE(has(err, "communicator")) << err;
  auto wrong = make_threaded_world({0, 1, 1, 1});
  err = error_of(
      [&] { ShardedExecutable::compile(program(), {}, DeviceParallelism::automatic, &wrong->communicator(1)); });
  EXPECT_TRUE(has(err, "not the positions of one process")) << err;

  Array x = testing::random_array({8, 3});
  Array want = ShardedExecutable::compile(*g, Mesh::cpu({{"data", 4}}), {PartitionSpec{"data"}})->run_full({x})[0];
  auto world = make_threaded_world(mesh.process_layout());
  std::vector<Array> got(2);
  std::vector<std::string> errors(2);
  world->run([&](int p, Communicator& comm) {
    auto exe = ShardedExecutable::compile(program(), {}, DeviceParallelism::automatic, &comm);
    EXPECT_EQ(exe->process(), p);
    EXPECT_EQ(exe->positions(), mesh.local_positions(p));
    EXPECT_EQ(exe->executable().num_devices(), 2);
    got[p] = exe->run_full({x})[0];
    // Inputs of the other process are rejected before any collective.
    errors[p] = error_of([&] { exe->run({shard(x, exe->in_sharding(0), 1 - p)}); });
  });
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(got[p].to_f32(), want.to_f32());
    EXPECT_TRUE(has(errors[p], "holds the shards of process " + std::to_string(1 - p))) << errors[p];
  }
}

// px::jit over two processes: each runs its own positions, outputs are gathered to every process.
TEST(Processes, JitFunctionOverTwoProcesses) {
  Mesh single = Mesh::cpu({{"data", 4}});
  Mesh split = single.with_processes(2);
  auto fn = [](const std::vector<Tensor>& params, const std::vector<Tensor>& args) {
    return std::vector<Tensor>{matmul(args[0], params[0])};
  };
  const std::vector<TensorType> pt{{DType::f32, {3, 5}}}, at{{DType::f32, {8, 3}}};
  Array w = testing::random_array({3, 5}, DType::f32, 2), x = testing::random_array({8, 3}, DType::f32, 3);
  Array want = (*jit(fn, ShardingStrategy::DDP, pt, {"w"}, at, single))({w}, {x})[0];
  auto world = make_threaded_world(split.process_layout());
  std::vector<Array> got(2);
  world->run([&](int p, Communicator& comm) {
    ShardingOptions o;
    o.communicator = &comm;
    auto f = jit(fn, ShardingStrategy::DDP, pt, {"w"}, at, split, o);
    EXPECT_EQ(f->executable().process(), p);
    got[p] = (*f)({w}, {x})[0];
  });
  for (int p = 0; p < 2; ++p) EXPECT_EQ(got[p].to_f32(), want.to_f32()) << "process " << p;
}

// DDP and FSDP steps of a tiny GPT on cpu:4 as 2 processes of 2 devices: every process builds its
// own step with its communicator and holds only its shards; losses, gradient norms, params and
// optimizer state equal the single-process cpu:4 run bitwise.
void check_two_processes(ShardingStrategy strategy) {
  using namespace recipe_check;
  const nn::LmConfig cfg = gpt_micro();
  const int steps = 3;
  Mesh single = Mesh::cpu({{"data", 4}});
  Mesh split = single.with_processes(2);
  ShardingOptions sopt;
  sopt.device_parallelism = DeviceParallelism::over_devices;  // the same kernels' threading in both runs
  sopt.auto_cluster = "h100x8";                               // AUTO: process 0 solves, process 1 takes its plan
  sopt.auto_time_limit_s = 120;

  Fixture f(cfg);
  TrainStep ref(f.model.store(), opt(), f.loss, f.batch_types, px::testing::on_mesh(single, strategy, sopt));
  TrainState rs = ref.init(0);
  std::vector<StepMetrics> want;
  for (int i = 0; i < steps; ++i) want.push_back(ref(rs, f.batch(i)));
  std::vector<Array> want_params = ref.gather_params(rs), want_state = ref.gather_opt_state(rs);

  struct Result {
    std::vector<StepMetrics> metrics;
    std::vector<Array> params, state;
    std::vector<std::vector<int>> param_positions;
    std::string remote_error;
    int64_t shards = 0;
    bool reloaded_same = false;
    int64_t save_load_collectives = 0;
  };
  const std::string dir = temp_dir(strategy_name(strategy));
  std::vector<Result> got(2);
  auto world = make_threaded_world(split.process_layout());
  world->run([&](int p, Communicator& comm) {
    Fixture pf(cfg);
    ShardingOptions o = sopt;
    o.communicator = &comm;
    TrainStep step(pf.model.store(), opt(), pf.loss, pf.batch_types, px::testing::on_mesh(split, strategy, o));
    EXPECT_EQ(step.process(), p);
    TrainState s = step.init(0);
    for (int i = 0; i < steps; ++i) got[p].metrics.push_back(step(s, pf.batch(i)));
    for (const ShardedArray& a : s.params) {
      got[p].param_positions.push_back(a.positions());
      got[p].shards += static_cast<int64_t>(a.shards().size());
    }
    got[p].remote_error = error_of([&] { s.params[0].shard(p == 0 ? 2 : 0); });
    got[p].params = step.gather_params(s);  // a collective: both processes call it
    got[p].state = step.gather_opt_state(s);
    // Every process saves its own shards (process 0 commits) and loads its own shards back,
    // without a collective: nothing is gathered.
    comm.reset_stats();
    step.save(dir + "/state", s);
    TrainState l = step.load(dir + "/state");
    for (int k = 0; k < kNumCollectiveKinds; ++k)
      got[p].save_load_collectives +=
          comm.stats().per_device.empty() ? 0 : comm.stats().total(static_cast<CollectiveKind>(k)).calls;
    bool same = l.step == s.step;
    for (size_t i = 0; i < s.params.size(); ++i)
      same = same && l.params[i].process() == p && local_values(l.params[i]) == local_values(s.params[i]);
    for (size_t i = 0; i < s.opt_state.size(); ++i)
      same = same && local_values(l.opt_state[i]) == local_values(s.opt_state[i]);
    // The single-file export (gathered; process 0 writes) reads back the same shards too.
    step.save(dir + "/state.safetensors", s);
    TrainState x = step.load(dir + "/state.safetensors");
    for (size_t i = 0; i < s.params.size(); ++i) same = same && local_values(x.params[i]) == local_values(s.params[i]);
    for (size_t i = 0; i < s.opt_state.size(); ++i)
      same = same && local_values(x.opt_state[i]) == local_values(s.opt_state[i]);
    got[p].reloaded_same = same;
  });
  // On disk, one chunk per distinct shard: the first split param's (or the first one's under DDP).
  const CheckpointInfo info = read_checkpoint_info(dir + "/state");
  EXPECT_EQ(info.step, steps);
  EXPECT_EQ(info.optimizer, opt()->name());
  size_t split_param = 0;
  for (size_t i = 0; i < f.model.store().size(); ++i)
    if (!ref.program().in_sharding(static_cast<int>(i)).is_fully_replicated()) {
      split_param = i;
      break;
    }
  const Sharding& w = ref.program().in_sharding(static_cast<int>(split_param));
  const std::string name = f.model.store().paths()[split_param];
  int64_t chunks = 0, distinct = 1;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/state/" + name + "/c"))
    chunks += e.is_regular_file();
  for (size_t d = 0; d < f.model.store().types()[split_param].shape.size(); ++d)
    distinct *= w.num_shards(static_cast<int>(d));
  EXPECT_EQ(chunks, distinct) << name << " " << w.to_string();
  if (strategy == ShardingStrategy::FSDP) EXPECT_GT(distinct, 1) << "no param of the FSDP plan is split";
  std::filesystem::remove_all(dir);
  const std::string what = std::string(strategy_name(strategy)) + " on " + split.to_string();
  for (int p = 0; p < 2; ++p) {
    const Result& r = got[p];
    ASSERT_EQ(r.metrics.size(), want.size());
    for (int i = 0; i < steps; ++i) {
      EXPECT_EQ(r.metrics[i].loss, want[i].loss) << what << " process " << p << " step " << i;
      EXPECT_EQ(r.metrics[i].grad_norm, want[i].grad_norm) << what << " process " << p << " step " << i;
    }
    for (const auto& pos : r.param_positions) EXPECT_EQ(pos, split.local_positions(p)) << what;
    EXPECT_EQ(r.shards, 2 * static_cast<int64_t>(r.param_positions.size())) << what;
    EXPECT_TRUE(has(r.remote_error, "lives in process " + std::to_string(1 - p))) << r.remote_error;
    EXPECT_TRUE(r.reloaded_same) << what << " process " << p << ": save and load changed the state";
    EXPECT_EQ(r.save_load_collectives, 0) << what << " process " << p << ": save or load gathered";
    ASSERT_EQ(r.params.size(), want_params.size());
    for (size_t i = 0; i < want_params.size(); ++i)
      EXPECT_EQ(r.params[i].to_f32(), want_params[i].to_f32()) << what << " param " << i << " process " << p;
    ASSERT_EQ(r.state.size(), want_state.size());
    for (size_t i = 0; i < want_state.size(); ++i)
      EXPECT_EQ(r.state[i].to_f32(), want_state[i].to_f32()) << what << " state " << i << " process " << p;
  }
}

TEST(Processes, DdpOverTwoProcessesEqualsOneProcessBitwise) { check_two_processes(ShardingStrategy::DDP); }
TEST(Processes, FsdpOverTwoProcessesEqualsOneProcessBitwise) { check_two_processes(ShardingStrategy::FSDP); }
TEST(Processes, AutoOverTwoProcessesEqualsOneProcessBitwise) { check_two_processes(ShardingStrategy::AUTO); }

// A sharded checkpoint written by two processes (each its own chunks) and read back by each for
// its own positions, or whole onto one device.
TEST(Processes, ShardedCheckpointWrittenAndReadByTwoProcesses) {
  Mesh mesh = Mesh::cpu({{"data", 4}}).with_processes(2);
  Sharding rows(mesh, PartitionSpec{"data"});
  Array full = testing::random_array({8, 3});
  const std::string dir = temp_dir("ckpt");
  auto world = make_threaded_world(mesh.process_layout());
  std::vector<std::vector<std::vector<float>>> restored(2);
  std::vector<std::vector<float>> whole(2);
  world->run([&](int p, Communicator& comm) {
    CheckpointOptions o;
    o.processes.index = p;
    o.processes.barrier = [&](const std::string&) { comm.barrier(); };
    CheckpointManager m(dir, o);
    Checkpoint c(7);
    c.add("w", shard(full, rows, p));
    m.save(c);
    comm.barrier();  // process 0 commits after the second stage; read once it has
    RestoreOptions ro;
    ro.shardings = {{"w", rows}};
    ro.process = p;
    ShardedArray w = m.restore(7, ro).get("w");
    EXPECT_EQ(w.process(), p);
    restored[p] = local_values(w);
    whole[p] = m.restore(7).get("w").shards()[0].to_f32();
  });
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(restored[p], local_values(shard(full, rows, p))) << "process " << p;
    EXPECT_EQ(whole[p], full.to_f32()) << "process " << p;
  }
  std::filesystem::remove_all(dir);
}

TEST(Processes, TrainStepOnAMultiProcessMeshNeedsACommunicator) {
  using namespace recipe_check;
  Fixture f(gpt_micro());
  Mesh split = Mesh::cpu({{"data", 4}}).with_processes(2);
  std::string err = error_of([&] {
    TrainStep step(f.model.store(), opt(), f.loss, f.batch_types, {.mesh = split, .strategy = ShardingStrategy::DDP});
  });
  EXPECT_TRUE(has(err, "ShardingOptions::communicator")) << err;
}

}  // namespace
}  // namespace px
