// Global arrays: shard() then gather() gives back the array, for every kind of sharding.
#include <gtest/gtest.h>

#include "parallax/checkpoint.h"
#include "parallax/sharding.h"
#include "testing.h"

namespace px {
namespace {

using testing::random_array;

TEST(ShardedArray, SplitRowsOverData) {
  Mesh m = Mesh::cpu({{"data", 4}});
  Array x = Array::from_f32({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2});
  ShardedArray s = shard(x, Sharding(m, {"data"}));
  ASSERT_EQ(s.shards().size(), 4u);
  EXPECT_EQ(s.shard(2).shape(), (Shape{1, 2}));
  EXPECT_EQ(s.shard(2).to_f32(), (std::vector<float>{4, 5}));
  EXPECT_EQ(s.bytes_per_device(), 8);
  EXPECT_EQ(gather(s).to_f32(), x.to_f32());
}

TEST(ShardedArray, RoundTripsOnManyMeshesAndSpecs) {
  Array x = random_array({8, 16, 4}, DType::f32, 3);
  std::vector<std::pair<Mesh, PartitionSpec>> cases = {
      {Mesh::cpu({{"x", 1}}), {}},
      {Mesh::cpu({{"data", 8}}), {"data"}},
      {Mesh::cpu({{"data", 4}, {"model", 2}}), {"data", "model"}},
      {Mesh::cpu({{"data", 4}, {"model", 2}}), {"model", none, "data"}},
      {Mesh::cpu({{"data", 2}, {"model", 4}}), {none, {"model", "data"}}},
      {Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}), {{"data", "fsdp"}, "model"}},
      {Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}), {"fsdp", none, "model"}},
  };
  for (auto& [mesh, spec] : cases) {
    ShardedArray s = shard(x, Sharding(mesh, spec));
    EXPECT_EQ(gather(s).to_f32(), x.to_f32()) << mesh.to_string() << " " << spec.to_string();
  }
}

TEST(ShardedArray, ReplicatedShardsAreFullCopies) {
  Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  Array x = random_array({3, 5}, DType::bf16, 4);
  ShardedArray s = shard(x, Sharding::replicated(m));
  for (const Array& a : s.shards()) EXPECT_EQ(a.to_f32(), x.to_f32());
  EXPECT_EQ(gather(s).to_f32(), x.to_f32());
}

TEST(ShardedArray, PartialSumsAddUpToTheValue) {
  Mesh m = Mesh::cpu({{"data", 2}, {"model", 2}});
  Array x = Array::from_f32({1, 2, 3, 4}, {2, 2});
  ShardedArray s = shard(x, Sharding(m, {"data"}, {"model"}));
  // Position 1 is (data 0, model 1): not the holder on the partial axis.
  EXPECT_EQ(s.shard(1).to_f32(), (std::vector<float>{0, 0}));
  EXPECT_EQ(s.shard(2).to_f32(), (std::vector<float>{3, 4}));
  EXPECT_EQ(gather(s).to_f32(), x.to_f32());
  // Hand-made partial shards: each device holds a quarter of the value.
  std::vector<Array> parts;
  for (int p = 0; p < 4; ++p) parts.push_back(Array::from_f32({0.25f * (p + 1), 1}, {2}));
  ShardedArray q({DType::f32, {2}}, Sharding(m, {}, {"data", "model"}), parts);
  EXPECT_EQ(gather(q).to_f32(), (std::vector<float>{2.5f, 4}));
}

TEST(ShardedArray, IntegerShards) {
  Mesh m = Mesh::cpu({{"data", 2}});
  Array x = Array::from_i32({1, 2, 3, 4, 5, 6}, {2, 3});
  ShardedArray s = shard(x, Sharding(m, {"data"}));
  EXPECT_EQ(s.shard(1).to_i32(), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(gather(s).to_i32(), x.to_i32());
}

TEST(ShardedArray, WrongShardsAreRejected) {
  Mesh m = Mesh::cpu({{"data", 2}});
  EXPECT_THROW(ShardedArray({DType::f32, {4}}, Sharding(m, {"data"}), {Array::zeros(DType::f32, {2})}), Error);
  EXPECT_THROW(ShardedArray({DType::f32, {4}}, Sharding(m, {"data"}),
                            {Array::zeros(DType::f32, {2}), Array::zeros(DType::f32, {4})}),
               Error);
  EXPECT_THROW(shard(Array::zeros(DType::f32, {3}), Sharding(m, {"data"})), Error);
}

// A default-constructed ShardedArray has no shards: gather() read past them (SIGSEGV). Every entry
// of the sharding API that reads shards now says what is wrong instead.
TEST(ShardedArray, EmptyOrIncompleteArraysAreErrorsNotCrashes) {
  const ShardedArray empty;
  std::string e = testing::error_of([&] { gather(empty); });
  EXPECT_EQ(e,
            "[gather] the ShardedArray has no shards (default-constructed, moved from or cleared); "
            "make one with px::shard(array, sharding) or ShardedArray(type, sharding, shards)");
  EXPECT_THROW(gather(empty), UserError);
  e = testing::error_of([&] { empty.shard(0); });
  EXPECT_NE(e.find("[sharding] the ShardedArray has no shards"), std::string::npos) << e;
  EXPECT_NE(testing::error_of([&] { empty.shard(3); }).find("mesh position 3 is not in"), std::string::npos);
  EXPECT_EQ(empty.bytes_per_device(), 0);
  Checkpoint c(1);
  c.add("w", empty);
  EXPECT_NE(testing::error_of([&] { c.full("w"); }).find("[gather] the ShardedArray has no shards"), std::string::npos);

  // Shards replaced through mutable_shards(): missing, undefined or of another type.
  Mesh m = Mesh::cpu({{"data", 4}});
  ShardedArray s = shard(Array::from_f32({0, 1, 2, 3, 4, 5, 6, 7}, {4, 2}), Sharding(m, {"data"}));
  ShardedArray fewer = s;
  fewer.mutable_shards().pop_back();
  e = testing::error_of([&] { gather(fewer); });
  EXPECT_NE(e.find("holds 3 shards for the 4 positions of its process"), std::string::npos) << e;
  ShardedArray undefined = s;
  undefined.mutable_shards()[2] = Array();
  e = testing::error_of([&] { gather(undefined); });
  EXPECT_NE(e.find("shard 2 of the ShardedArray of f32[4,2]"), std::string::npos) << e;
  EXPECT_NE(e.find("is undefined, expected f32[1,2]"), std::string::npos) << e;
  ShardedArray wrong = s;
  wrong.mutable_shards()[1] = Array(DType::f32, {2, 2});
  e = testing::error_of([&] { gather(wrong); });
  EXPECT_NE(e.find("is of type f32[2,2], expected f32[1,2]"), std::string::npos) << e;
  EXPECT_EQ(gather(s).to_f32(), (std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7}));
}

}  // namespace
}  // namespace px
