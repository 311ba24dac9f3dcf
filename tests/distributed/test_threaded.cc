// The threaded world: N "processes" as threads, each with its own communicator holding only its
// mesh positions. Every collective gives bitwise the in-process result; calls that stay inside a
// process do not wait for the others; mismatched calls and failed processes are clear errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "distributed/threaded.h"
#include "parallax/communicator.h"
#include "parallax/sharding.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;

// Position p holds count values (p + 1) * 0.37 + i * 0.011: sums are inexact, so a different
// reduction order would show.
std::vector<float> input_of(int p, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = (p + 1) * 0.37f + static_cast<float>(i) * 0.011f;
  return v;
}

// Runs `op` once with every position local (inproc) and once over the world's processes, and
// checks every position's output is bitwise the same.
using Op = std::function<void(Communicator&, const Buffers&, const MutBuffers&)>;
void check_same(const Mesh& mesh, int64_t in_count, int64_t out_count, const Op& op, const std::string& what) {
  const int W = static_cast<int>(mesh.size());
  std::vector<std::vector<float>> in(W), want(W, std::vector<float>(out_count, -1)),
      got(W, std::vector<float>(out_count, -1));
  for (int p = 0; p < W; ++p) in[p] = input_of(p, in_count);
  auto inproc = make_inproc_communicator(W);
  Buffers ins;
  MutBuffers outs;
  for (int p = 0; p < W; ++p) {
    ins.push_back(in[p].data());
    outs.push_back(want[p].data());
  }
  op(*inproc, ins, outs);
  auto world = make_threaded_world(mesh.process_layout());
  world->run([&](int process, Communicator& comm) {
    Buffers i;
    MutBuffers o;
    for (int p : mesh.local_positions(process)) {
      i.push_back(in[p].data());
      o.push_back(got[p].data());
    }
    op(comm, i, o);
  });
  for (int p = 0; p < W; ++p)
    ASSERT_EQ(0, std::memcmp(want[p].data(), got[p].data(), out_count * sizeof(float)))
        << what << ": position " << p << " differs";
}

TEST(Threaded, EveryCollectiveMatchesInprocBitwise) {
  // data: 2 over 2 processes, model: 2 inside each: 'data' groups cross processes, 'model' ones do not.
  Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 2}}).with_processes(2);
  ASSERT_EQ(mesh.local_positions(1), (std::vector<int>{2, 3}));
  const int64_t n = 4100;  // over two reduction chunks
  for (std::vector<int> axes : {std::vector<int>{0}, std::vector<int>{1}, std::vector<int>{0, 1}}) {
    auto groups = mesh.groups(axes);
    const int64_t g = static_cast<int64_t>(groups[0].size());
    const std::string on = "axes " + std::to_string(axes[0]) + (axes.size() > 1 ? ",1" : "");
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
      check_same(
          mesh, n, n,
          [&](Communicator& c, const Buffers& i, const MutBuffers& o) {
            c.all_reduce(i, o, n, DType::f32, op, groups);
          },
          "all_reduce " + on);
    check_same(
        mesh, n, n * g,
        [&](Communicator& c, const Buffers& i, const MutBuffers& o) { c.all_gather(i, o, n, DType::f32, groups); },
        "all_gather " + on);
    check_same(
        mesh, n * g, n,
        [&](Communicator& c, const Buffers& i, const MutBuffers& o) {
          c.reduce_scatter(i, o, n * g, DType::f32, ReduceOp::sum, groups);
        },
        "reduce_scatter " + on);
    check_same(
        mesh, n * g, n * g,
        [&](Communicator& c, const Buffers& i, const MutBuffers& o) { c.all_to_all(i, o, n * g, DType::f32, groups); },
        "all_to_all " + on);
    check_same(
        mesh, n, n,
        [&](Communicator& c, const Buffers& i, const MutBuffers& o) { c.broadcast(i, o, n, DType::f32, 1, groups); },
        "broadcast " + on);
  }
  // A ring across the processes; position 1 receives nothing (zero-filled).
  check_same(
      mesh, 10, 10,
      [&](Communicator& c, const Buffers& i, const MutBuffers& o) {
        c.permute(i, o, 10, DType::f32, {{0, 2}, {2, 3}, {3, 0}});
      },
      "permute");
}

TEST(Threaded, InPlaceAllReduceAcrossProcessesAnd16BitFloats) {
  Mesh mesh = Mesh::cpu({{"data", 4}}).with_processes(2);
  std::vector<Array> a;
  for (int p = 0; p < 4; ++p) a.push_back(Array::from_f32({1.0f + p, -2.0f * p, 0.5f}, {3}, DType::bf16));
  auto world = make_threaded_world(mesh.process_layout());
  world->run([&](int process, Communicator& comm) {
    Buffers i;
    MutBuffers o;
    for (int p : mesh.local_positions(process)) {
      i.push_back(a[p].raw());
      o.push_back(a[p].raw());  // in place: others read this input during the call
    }
    comm.all_reduce(i, o, 3, DType::bf16, ReduceOp::sum, mesh.groups({0}));
  });
  for (auto& x : a) EXPECT_EQ(x.to_f32(), (std::vector<float>{10, -12, 2}));
}

TEST(Threaded, CallsInsideOneProcessDoNotWait) {
  // 'model' groups lie inside each process: process 0 reduces alone while process 1 makes no call
  // at all; a rendezvous would time out after 2 s.
  Mesh mesh = Mesh::cpu({{"data", 2}, {"model", 2}}).with_processes(2);
  auto world = make_threaded_world(mesh.process_layout(), /*timeout_s=*/2);
  std::vector<float> x = {1, 2}, y = {3, 4}, ox(2), oy(2);
  world->run([&](int process, Communicator& comm) {
    if (process == 0)
      comm.all_reduce({x.data(), y.data()}, {ox.data(), oy.data()}, 2, DType::f32, ReduceOp::sum, mesh.groups({1}));
  });
  EXPECT_EQ(ox, (std::vector<float>{4, 6}));
  EXPECT_EQ(oy, (std::vector<float>{4, 6}));
  // Stats count only the caller's positions.
  EXPECT_EQ(world->communicator(0).stats().per_device[0][static_cast<int>(CollectiveKind::all_reduce)].calls, 1);
  EXPECT_EQ(world->communicator(1).stats().per_device[2][static_cast<int>(CollectiveKind::all_reduce)].calls, 0);
}

TEST(Threaded, MismatchedCallsAreAClearError) {
  Mesh mesh = Mesh::cpu({{"data", 2}}).with_processes(2);
  auto world = make_threaded_world(mesh.process_layout());
  std::vector<float> a(8), b(8);
  std::string err = error_of([&] {
    world->run([&](int process, Communicator& comm) {
      if (process == 0)
        comm.all_reduce({a.data()}, {b.data()}, 8, DType::f32, ReduceOp::sum, mesh.groups({0}));
      else
        comm.all_gather({a.data()}, {b.data()}, 4, DType::f32, mesh.groups({0}));
    });
  });
  EXPECT_NE(err.find("processes made different collective calls"), std::string::npos) << err;
  EXPECT_NE(err.find("same calls in the same order"), std::string::npos) << err;
}

TEST(Threaded, AFailedProcessReleasesTheOthers) {
  Mesh mesh = Mesh::cpu({{"data", 2}}).with_processes(2);
  auto world = make_threaded_world(mesh.process_layout(), /*timeout_s=*/120);
  std::vector<float> a(8), b(8);
  std::atomic<bool> released{false};
  auto t0 = std::chrono::steady_clock::now();
  std::string err = error_of([&] {
    world->run([&](int process, Communicator& comm) {
      if (process == 1) throw Error("process 1 ran out of data");
      try {
        comm.all_reduce({a.data()}, {b.data()}, 8, DType::f32, ReduceOp::sum, mesh.groups({0}));
      } catch (const Error& e) {
        released = std::string(e.what()).find("process 1 failed") != std::string::npos;
        throw;
      }
    });
  });
  EXPECT_EQ(err, "process 1 ran out of data");  // the first error, not the consequence
  EXPECT_TRUE(released.load());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 60.0);
  // The world is usable again afterwards.
  world->run([&](int, Communicator& comm) { comm.barrier(); });
}

TEST(Threaded, BadWorldsAreErrors) {
  EXPECT_NE(error_of([] { make_threaded_world({}); }).find("at least one mesh position"), std::string::npos);
  EXPECT_NE(error_of([] { make_threaded_world({0, 2}); }).find("process 1 holds no mesh position"), std::string::npos);
  EXPECT_NE(error_of([] { make_threaded_world({0, -1}); }).find("negative"), std::string::npos);
  auto world = make_threaded_world({0, 0, 1, 1});
  EXPECT_EQ(world->num_processes(), 2);
  EXPECT_EQ(world->communicator(1).local_positions(), (std::vector<int>{2, 3}));
  EXPECT_EQ(world->communicator(1).world_size(), 4);
  EXPECT_NE(error_of([&] { world->communicator(2); }).find("not one of the 2 processes"), std::string::npos);
}

}  // namespace
}  // namespace px
