// The sharded executor's collectives on hand-built local programs: each collective is a reshard,
// so the gathered output must equal the gathered input; dims that are not leading exercise the
// layout packing around the communicator.
#include <gtest/gtest.h>

#include "ir/primitive.h"
#include "parallax/spmd.h"
#include "testing.h"

namespace px {
namespace {

using testing::random_array;

using Emit = std::function<Tensor(CollectiveEmitter&, const Tensor&)>;

// A local program of one collective from `in` to `out` sharding, run on shards of `x`.
ShardedArray run_one(const Mesh& mesh, const Array& x, const Sharding& in, const Sharding& out, const Emit& emit,
                     int64_t* payload = nullptr) {
  SpmdProgram p;
  p.mesh = mesh;
  p.local = std::make_unique<Graph>();
  Tensor a = p.local->input({x.dtype(), in.local_shape(x.shape())}, "x");
  Tensor coords = p.local->input({DType::i32, {mesh.rank()}}, "device_coords");
  CollectiveEmitter em;
  em.bind(&mesh, coords);
  p.local->set_outputs({emit(em, a)});
  p.in_shardings = {in};
  p.out_shardings = {out};
  auto exe = ShardedExecutable::compile(std::move(p));
  auto res = exe->run({shard(x, in)});
  if (payload) {
    *payload = 0;
    for (int k = 0; k < kNumCollectiveKinds; ++k)
      *payload += exe->stats().at(0, static_cast<CollectiveKind>(k)).payload_bytes;
  }
  return res.at(0);
}

const Mesh kMesh = Mesh::cpu({{"x", 2}, {"y", 2}});

TEST(ShardedExecutor, AllGatherOnInnerDim) {
  Array x = random_array({3, 8, 5}, DType::f32, 1);
  int64_t payload = 0;
  auto r = run_one(
      kMesh, x, Sharding(kMesh, {none, {"x", "y"}}), Sharding(kMesh, {none, "x"}),
      [](CollectiveEmitter& e, const Tensor& t) { return e.all_gather(t, {"y"}, 1); }, &payload);
  EXPECT_EQ(r.shard(0).shape(), (Shape{3, 4, 5}));
  EXPECT_EQ(gather(r).to_f32(), x.to_f32());
  EXPECT_EQ(payload, 3 * 4 * 5 * 4);  // the gathered result, per device
}

TEST(ShardedExecutor, ReduceScatterOnInnerDimSumsPartials) {
  Array x = random_array({3, 4, 6}, DType::f32, 2);
  auto r = run_one(kMesh, x, Sharding(kMesh, {}, {"x"}), Sharding(kMesh, {none, none, "x"}),
                   [](CollectiveEmitter& e, const Tensor& t) { return e.reduce_scatter(t, {"x"}, 2, "sum"); });
  EXPECT_EQ(r.shard(0).shape(), (Shape{3, 4, 3}));
  EXPECT_TRUE(testing::all_close(gather(r).to_f32(), x.to_f32()));
}

TEST(ShardedExecutor, AllReduceMaxOfPartials) {
  Array x = random_array({4, 3}, DType::f32, 3);
  // Partial "max": shard() puts the value on coordinate 0 and zeros elsewhere; max with 0 clips at 0.
  auto r = run_one(kMesh, x, Sharding(kMesh, {}, {"y"}), Sharding(kMesh, {}),
                   [](CollectiveEmitter& e, const Tensor& t) { return e.all_reduce(t, {"y"}, "max"); });
  std::vector<float> want = x.to_f32();
  for (auto& v : want) v = std::max(v, 0.0f);
  EXPECT_EQ(gather(r).to_f32(), want);
}

TEST(ShardedExecutor, AllToAllBetweenAnyDims) {
  Array x = random_array({4, 6, 8}, DType::f32, 4);
  auto r = run_one(kMesh, x, Sharding(kMesh, {none, none, {"x", "y"}}), Sharding(kMesh, {none, "y", "x"}),
                   [](CollectiveEmitter& e, const Tensor& t) { return e.all_to_all(t, {"y"}, 1, 2); });
  EXPECT_EQ(r.shard(0).shape(), (Shape{4, 3, 4}));
  EXPECT_EQ(gather(r).to_f32(), x.to_f32());
  auto q = run_one(kMesh, x, Sharding(kMesh, {"x"}), Sharding(kMesh, {none, none, "x"}),
                   [](CollectiveEmitter& e, const Tensor& t) { return e.all_to_all(t, {"x"}, 2, 0); });
  EXPECT_EQ(gather(q).to_f32(), x.to_f32());
}

TEST(ShardedExecutor, LocalSliceTakesThisDevicesBlock) {
  Array x = random_array({8, 4}, DType::bf16, 5);
  auto r =
      run_one(kMesh, x, Sharding(kMesh, {}), Sharding(kMesh, {{"y", "x"}}), [](CollectiveEmitter& e, const Tensor& t) {
        return e.local_slice(t, {"y", "x"}, 0);
      });
  EXPECT_EQ(r.shard(1).shape(), (Shape{2, 4}));
  EXPECT_EQ(gather(r).to_f32(), x.to_f32());
}

TEST(ShardedExecutor, CollectivePermuteShiftsAlongAnAxis) {
  Array x = random_array({2, 6}, DType::f32, 6);
  // Within each 'x' group, member 0 sends to member 1 and back: swaps the two row blocks.
  auto r = run_one(kMesh, x, Sharding(kMesh, {"x"}), Sharding(kMesh, {"x"}), [](CollectiveEmitter&, const Tensor& t) {
    return emit1("collective_permute", {t},
                 Attrs{{"axes", std::string("x")}, {"group", int64_t{2}}, {"pairs", std::vector<int64_t>{0, 1, 1, 0}}});
  });
  std::vector<float> in = x.to_f32(), got = gather(r).to_f32();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(got[i], in[6 + i]);
    EXPECT_EQ(got[6 + i], in[i]);
  }
}

TEST(ShardedExecutor, OutputsAreComputedInPlaceWithoutTouchingHeldArrays) {
  // y = all_reduce(x) * 2 (a collective's result is an output too, then a segment's).
  TracedFn f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(in[0], {0}), in[0] * 2.0}; };
  Mesh mesh = Mesh::cpu({{"data", 2}});
  auto g = trace(f, {{DType::f32, {4, 3}}});
  auto exe = ShardedExecutable::compile(*g, mesh, {{"data"}});
  Array x = random_array({4, 3}, DType::f32, 7), x2 = random_array({4, 3}, DType::f32, 8);
  std::vector<ShardedArray> in = {shard(x, exe->in_sharding(0))}, out;
  exe->run_into(in, out);
  // The executor keeps no handle on the caller's arrays between runs (so they can be reused).
  EXPECT_TRUE(in[0].shard(1).sole_owner());
  EXPECT_TRUE(out[1].shard(1).sole_owner());
  std::vector<float> first = gather(out[1]).to_f32();
  const void* where = out[1].shard(1).raw();
  // Sole owner: the next run writes into the same buffers.
  exe->run_into({shard(x2, exe->in_sharding(0))}, out);
  EXPECT_EQ(out[1].shard(1).raw(), where);
  std::vector<float> twice = x2.to_f32();
  for (float& v : twice) v *= 2.0f;
  EXPECT_EQ(gather(out[1]).to_f32(), twice);
  // The caller keeps the result: the next run must leave it alone.
  ShardedArray kept = out[1];
  std::vector<float> kept_values = gather(kept).to_f32();
  exe->run_into(in, out);
  EXPECT_NE(out[1].shard(1).raw(), kept.shard(1).raw());
  EXPECT_EQ(gather(kept).to_f32(), kept_values);
  EXPECT_EQ(gather(out[1]).to_f32(), first);
  EXPECT_TRUE(testing::all_close(gather(out[0]).to_f32(), exe->run_full({x})[0].to_f32()));
}

}  // namespace
}  // namespace px
