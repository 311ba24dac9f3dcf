// Meshes, partition specs, shardings: coordinates, groups, printing, parsing and validation.
#include <gtest/gtest.h>

#include "parallax/sharding.h"

namespace px {
namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Mesh, CpuMeshHasVirtualDevicesAndRowMajorCoords) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  EXPECT_EQ(m.size(), 8);
  EXPECT_EQ(m.rank(), 2);
  EXPECT_EQ(m.axis_size("model"), 2);
  EXPECT_EQ(m.coords(5), (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(m.position({3, 0}), 6);
  EXPECT_EQ(m.to_string(), "Mesh{data: 4, model: 2} on cpu:8");
  EXPECT_EQ(Mesh().size(), 1);
}

TEST(Mesh, GroupsShareEveryOtherCoordinate) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  auto model = m.groups({1});
  ASSERT_EQ(model.size(), 4u);
  EXPECT_EQ(model[0], (std::vector<int>{0, 1}));
  EXPECT_EQ(model[3], (std::vector<int>{6, 7}));
  auto data = m.groups({0});
  ASSERT_EQ(data.size(), 2u);
  EXPECT_EQ(data[1], (std::vector<int>{1, 3, 5, 7}));
  // Both axes: one group; with the minor axis first, the order follows the given axes.
  EXPECT_EQ(m.groups({0, 1})[0], (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(m.groups({1, 0})[0], (std::vector<int>{0, 2, 4, 6, 1, 3, 5, 7}));
  EXPECT_EQ(m.index_in_group(5, {1, 0}), 6);
}

TEST(Mesh, ThreeDimensionalGroups) {
  Mesh m = Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}});
  auto g = m.groups({0, 1});
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0], (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(g[1], (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.group_size({0, 2}), 4);
}

TEST(Mesh, BadMeshesAreRejected) {
  EXPECT_NE(error_of([] { Mesh::cpu({{"data", 2}, {"data", 2}}); }).find("appears twice"), std::string::npos);
  EXPECT_NE(error_of([] { Mesh::cpu({{"data", 0}}); }).find("size 0"), std::string::npos);
  EXPECT_NE(error_of([] { Mesh({{"x", 2, {}}}, {0, 1, 2}); }).find("2 devices but 3"), std::string::npos);
  Mesh m = Mesh::cpu({{"data", 2}});
  std::string e = error_of([&] { m.require_axis("model", "shard"); });
  EXPECT_NE(e.find("[shard] unknown mesh axis 'model'; the mesh Mesh{data: 2} on cpu:2 has 'data'"), std::string::npos)
      << e;
}

TEST(PartitionSpec, PrintsAndParsesLikeJax) {
  PartitionSpec a{"data", none};
  EXPECT_EQ(a.to_string(), "P('data', None)");
  PartitionSpec b{{"data", "fsdp"}, "model"};
  EXPECT_EQ(b.to_string(), "P(('data', 'fsdp'), 'model')");
  EXPECT_EQ(PartitionSpec().to_string(), "P()");
  EXPECT_EQ(PartitionSpec::replicated(2).to_string(), "P(None, None)");
  for (const PartitionSpec& s : {a, b, PartitionSpec(), PartitionSpec{none, "x"}})
    EXPECT_EQ(PartitionSpec::parse(s.to_string()), s) << s.to_string();
  EXPECT_EQ(PartitionSpec::parse(" P( ( 'a' , 'b' ) , None ) "), (PartitionSpec{{"a", "b"}, none}));
  // Trailing unsplit dims do not change the meaning.
  EXPECT_EQ((PartitionSpec{"data"}), (PartitionSpec{"data", none}));
  EXPECT_NE(error_of([] { PartitionSpec::parse("P('data'"); }).find("cannot parse partition spec"), std::string::npos);
  EXPECT_NE(error_of([] { PartitionSpec::parse("P(data)"); }).find("quoted axis name"), std::string::npos);
}

TEST(Sharding, LocalShapesAndOffsets) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  Sharding s(m, {"model", "data"});
  EXPECT_EQ(s.local_shape({6, 8, 3}), (Shape{3, 2, 3}));
  EXPECT_EQ(s.shard_offsets({6, 8, 3}, 5), (std::vector<int64_t>{3, 4, 0}));  // coords (2, 1)
  Sharding both(m, {{"data", "model"}});
  EXPECT_EQ(both.local_shape({16}), (Shape{2}));
  EXPECT_EQ(both.shard_offsets({16}, 5), (std::vector<int64_t>{10}));  // 2 * 2 + 1 = block 5
  EXPECT_EQ(Sharding(m, {none, "model"}, {"data"}).to_string(), "P(None, 'model') partial(data)");
}

TEST(Sharding, ValidationNamesTheValueDimAxisAndAFix) {
  Mesh m = Mesh::cpu({{"data", 4}, {"model", 2}});
  TensorType t{DType::f32, {30, 16}};
  std::string e = error_of([&] { Sharding(m, {"data"}).validate(t, "param 'blocks.0.w'"); });
  EXPECT_NE(e.find("param 'blocks.0.w' f32[30,16]"), std::string::npos) << e;
  EXPECT_NE(e.find("dim 0 has size 30, not divisible by 4 = 'data'(4)"), std::string::npos) << e;
  EXPECT_NE(e.find("unused mesh axes that divide it: 'model'(2)"), std::string::npos) << e;
  EXPECT_NE(e.find("a multiple of 4 (e.g. 32)"), std::string::npos) << e;

  e = error_of([&] { Sharding(m, {"batch"}).validate(t, "input 'x'"); });
  EXPECT_NE(e.find("dim 0 names unknown mesh axis 'batch'; the mesh has 'data', 'model'"), std::string::npos) << e;
  e = error_of([&] { Sharding(m, {"model", "model"}).validate(t, "x"); });
  EXPECT_NE(e.find("mesh axis 'model' is used twice (again on dim 1)"), std::string::npos) << e;
  e = error_of([&] { Sharding(m, {none, none, "data"}).validate(t, "x"); });
  EXPECT_NE(e.find("the spec has 3 entries but the value has rank 2"), std::string::npos) << e;
  e = error_of([&] { Sharding(m, {"data"}, {"data"}).validate({DType::f32, {8}}, "x"); });
  EXPECT_NE(e.find("both splits a dim and holds partial sums"), std::string::npos) << e;
  e = error_of([&] { Sharding(m, {{"data", "model"}}).validate({DType::f32, {12}}, "x"); });
  EXPECT_NE(e.find("not divisible by 8 = 'data'(4) x 'model'(2)"), std::string::npos) << e;
  EXPECT_NO_THROW(Sharding(m, {{"data", "model"}}).validate({DType::f32, {16, 3}}, "x"));
}

}  // namespace
}  // namespace px
