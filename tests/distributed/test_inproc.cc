// In-process collectives on mesh sub-groups: results against a direct reference, and the bytes
// each device is charged.
#include <gtest/gtest.h>

#include "parallax/communicator.h"
#include "parallax/sharding.h"

namespace px {
namespace {

// Device p holds values base(p) + i for i < count.
std::vector<std::vector<float>> make_inputs(int devices, int64_t count) {
  std::vector<std::vector<float>> v(devices, std::vector<float>(count));
  for (int p = 0; p < devices; ++p)
    for (int64_t i = 0; i < count; ++i) v[p][i] = static_cast<float>(100 * p + i);
  return v;
}

struct Bufs {
  std::vector<std::vector<float>> in, out;
  Buffers ins() const {
    Buffers b;
    for (auto& x : in) b.push_back(x.data());
    return b;
  }
  MutBuffers outs() {
    MutBuffers b;
    for (auto& x : out) b.push_back(x.data());
    return b;
  }
};

Bufs bufs(int devices, int64_t in_count, int64_t out_count) {
  return {make_inputs(devices, in_count), std::vector<std::vector<float>>(devices, std::vector<float>(out_count, -1))};
}

TEST(Inproc, AllReduceSumAndMaxOverEachAxis) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  auto comm = make_inproc_communicator(8);
  for (int axis : {0, 1}) {
    auto groups = m.groups({axis});
    for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
      Bufs b = bufs(8, 5000, 5000);  // over two chunks
      comm->all_reduce(b.ins(), b.outs(), 5000, DType::f32, op, groups);
      for (auto& g : groups)
        for (int p : g)
          for (int64_t i : {0, 2047, 2048, 4999}) {
            float want = op == ReduceOp::sum ? 0.0f : -1e30f;
            for (int q : g) want = op == ReduceOp::sum ? want + b.in[q][i] : std::max(want, b.in[q][i]);
            ASSERT_EQ(b.out[p][i], want) << "axis " << axis << " device " << p << " element " << i;
          }
    }
  }
}

TEST(Inproc, AllReduceInPlaceAndOtherDtypes) {
  Mesh m = Mesh::cpu({{"x", 3}});
  auto comm = make_inproc_communicator(3);
  std::vector<Array> a;
  for (int p = 0; p < 3; ++p) a.push_back(Array::from_f32({1.0f + p, -2.0f * p}, {2}, DType::bf16));
  MutBuffers outs;
  Buffers ins;
  for (auto& x : a) {
    outs.push_back(x.raw());
    ins.push_back(x.raw());
  }
  comm->all_reduce(ins, outs, 2, DType::bf16, ReduceOp::sum, m.groups({0}));
  for (auto& x : a) EXPECT_EQ(x.to_f32(), (std::vector<float>{6, -6}));

  std::vector<Array> ints;
  for (int p = 0; p < 3; ++p) ints.push_back(Array::from_i32({p, 7 - p}, {2}));
  ins.clear();
  outs.clear();
  for (auto& x : ints) {
    ins.push_back(x.raw());
    outs.push_back(x.raw());
  }
  comm->all_reduce(ins, outs, 2, DType::i32, ReduceOp::max, m.groups({0}));
  for (auto& x : ints) EXPECT_EQ(x.to_i32(), (std::vector<int32_t>{2, 7}));
}

TEST(Inproc, AllGatherConcatenatesInGroupOrder) {
  Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  auto comm = make_inproc_communicator(4);
  Bufs b = bufs(4, 3, 6);
  comm->all_gather(b.ins(), b.outs(), 3, DType::f32, m.groups({0}));
  // Groups over 'data': {0, 2} and {1, 3}.
  EXPECT_EQ(b.out[2], (std::vector<float>{0, 1, 2, 200, 201, 202}));
  EXPECT_EQ(b.out[1], (std::vector<float>{100, 101, 102, 300, 301, 302}));
}

TEST(Inproc, ReduceScatterGivesEachMemberItsBlockOfTheSum) {
  Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  auto comm = make_inproc_communicator(4);
  Bufs b = bufs(4, 4, 2);
  comm->reduce_scatter(b.ins(), b.outs(), 4, DType::f32, ReduceOp::sum, m.groups({1}));
  // Group {0, 1}: sum = {100, 102, 104, 106}; member 1 gets block 1.
  EXPECT_EQ(b.out[0], (std::vector<float>{100, 102}));
  EXPECT_EQ(b.out[1], (std::vector<float>{104, 106}));
  EXPECT_EQ(b.out[3], (std::vector<float>{504, 506}));
}

TEST(Inproc, AllToAllTransposesBlocks) {
  Mesh m = Mesh::cpu({{"x", 2}, {"y", 2}});
  auto comm = make_inproc_communicator(4);
  Bufs b = bufs(4, 4, 4);
  comm->all_to_all(b.ins(), b.outs(), 4, DType::f32, m.groups({0, 1}));
  // One group of 4 with blocks of 1: out[k][j] = in[j][k].
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 4; ++j) EXPECT_EQ(b.out[k][j], b.in[j][k]);
}

TEST(Inproc, PermuteAndBroadcast) {
  auto comm = make_inproc_communicator(4);
  Bufs b = bufs(4, 2, 2);
  comm->permute(b.ins(), b.outs(), 2, DType::f32, {{0, 1}, {1, 2}, {2, 0}});
  EXPECT_EQ(b.out[1], (std::vector<float>{0, 1}));
  EXPECT_EQ(b.out[0], (std::vector<float>{200, 201}));
  EXPECT_EQ(b.out[3], (std::vector<float>{0, 0}));  // receives nothing
  Mesh m = Mesh::cpu({{"x", 2}, {"y", 2}});
  Bufs c = bufs(4, 2, 2);
  comm->broadcast(c.ins(), c.outs(), 2, DType::f32, 1, m.groups({1}));
  EXPECT_EQ(c.out[0], (std::vector<float>{100, 101}));
  EXPECT_EQ(c.out[3], (std::vector<float>{300, 301}));
}

TEST(Inproc, CountsBytesPerDeviceAndKind) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  auto comm = make_inproc_communicator(8);
  Bufs b = bufs(8, 64, 64);
  comm->all_reduce(b.ins(), b.outs(), 64, DType::f32, ReduceOp::sum, m.groups({0}));
  const auto& s = comm->stats();
  for (int p = 0; p < 8; ++p) {
    EXPECT_EQ(s.at(p, CollectiveKind::all_reduce).calls, 1);
    EXPECT_EQ(s.at(p, CollectiveKind::all_reduce).payload_bytes, 256);
    EXPECT_EQ(s.at(p, CollectiveKind::all_reduce).wire_bytes, 256 * 2 * 3 / 4);  // ring: 2(n-1)/n
  }
  Bufs g = bufs(8, 16, 32);
  comm->all_gather(g.ins(), g.outs(), 16, DType::f32, m.groups({1}));
  EXPECT_EQ(s.at(3, CollectiveKind::all_gather).payload_bytes, 128);
  EXPECT_EQ(s.at(3, CollectiveKind::all_gather).wire_bytes, 64);
  EXPECT_EQ(s.total(CollectiveKind::all_reduce).payload_bytes, 8 * 256);
  EXPECT_NE(s.to_string().find("all_gather: 8 device-calls, payload 1024 bytes"), std::string::npos) << s.to_string();
  comm->reset_stats();
  EXPECT_EQ(comm->stats().total(CollectiveKind::all_reduce).calls, 0);
}

TEST(Inproc, RejectsWrongBufferCounts) {
  auto comm = make_inproc_communicator(2);
  std::vector<float> x(4);
  EXPECT_THROW(comm->all_reduce({x.data()}, {x.data()}, 4, DType::f32, ReduceOp::sum, {{0, 1}}), Error);
  std::vector<float> y(4);
  EXPECT_THROW(comm->reduce_scatter({x.data(), y.data()}, {x.data(), y.data()}, 3, DType::f32, ReduceOp::sum, {{0, 1}}),
               Error);
}

}  // namespace
}  // namespace px
