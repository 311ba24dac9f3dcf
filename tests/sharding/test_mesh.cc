// Meshes, partition specs, shardings: coordinates, groups, printing, parsing and validation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "parallax/sharding.h"
#include "testing.h"

namespace px {
namespace {

using testing::error_of;

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

TEST(Devices, ParseCpuSets) {
  EXPECT_EQ(parse_devices("cpu:8"), (DeviceSet{"cpu", 8}));
  EXPECT_EQ(parse_devices("cpu"), (DeviceSet{"cpu", 1}));
  EXPECT_EQ(parse_devices("cpu:8").to_string(), "cpu:8");
  EXPECT_EQ(DeviceSet{}.to_string(), "cpu:1");
  EXPECT_EQ(error_of([] { parse_devices("cpu:zero"); }),
            "[devices] 'cpu:zero' is not a device set; use cpu (one device) or cpu:N with 1 <= N <= 65536 (N virtual "
            "CPU devices, e.g. cpu:8); another backend's devices likewise (ref:2)");
  EXPECT_EQ(parse_devices("ref:2"), (DeviceSet{"ref", 2}));
  const std::string cuda = error_of([] { parse_devices("cuda:4"); });
  EXPECT_EQ(cuda.rfind("[devices] 'cuda:4': no backend is registered for platform 'cuda'", 0), 0u) << cuda;
  EXPECT_NE(cuda.find("this program has no CUDA backend"), std::string::npos) << cuda;
}

TEST(Devices, CreateFillsTheRemainingAxis) {
  DeviceSet cpu8{"cpu", 8};
  Mesh m = Mesh::create({{"data", -1}, {"model", 2}}, cpu8);
  EXPECT_EQ(m, Mesh::cpu({{"data", 4}, {"model", 2}}));
  EXPECT_EQ(Mesh::create({{"data", 2}, {"model", -1}}, cpu8).axis_size("model"), 4);
  EXPECT_EQ(Mesh::create({{"data", 8}}, cpu8).to_string(), "Mesh{data: 8} on cpu:8");
  EXPECT_EQ(Mesh::create({{"data", -1}}, {"cpu", 1}).size(), 1);
  EXPECT_EQ(Mesh::create({}, {"cpu", 1}).size(), 1);
}

TEST(Devices, CreateErrorsNameTheAxesAndTheFix) {
  DeviceSet cpu4{"cpu", 4};
  EXPECT_EQ(
      error_of([&] {
        Mesh::create({{"data", 4}, {"model", 2}}, cpu4);
      }),
      "[mesh] {data: 4, model: 2} needs 8 devices but cpu:4 has 4; set PX_DEVICES=cpu:8 or change the axis sizes");
  EXPECT_EQ(error_of([&] {
              Mesh::create({{"data", -1}, {"model", 3}}, cpu4);
            }),
            "[mesh] {data: -1, model: 3}: the other axes need a multiple of 3 devices but cpu:4 has 4; set "
            "PX_DEVICES=cpu:N with N a multiple of 3 or change the axis sizes");
  EXPECT_EQ(error_of([&] {
              Mesh::create({{"data", -1}, {"model", -1}}, cpu4);
            }),
            "[mesh] {data: -1, model: -1}: axes 'data' and 'model' both have size -1; at most one axis can take the "
            "remaining devices");
  EXPECT_EQ(error_of([&] {
              Mesh::create({{"data", 0}, {"model", 4}}, cpu4);
            }),
            "[mesh] {data: 0, model: 4}: axis 'data' has size 0; sizes are >= 1, or -1 for the remaining devices");
  EXPECT_NE(error_of([&] { Mesh::create({{"data", -2}}, cpu4); }).find("axis 'data' has size -2"), std::string::npos);
  EXPECT_EQ(error_of([&] { Mesh::create({{"data", 2}, {"data", -1}}, cpu4); }), "[mesh] axis 'data' appears twice");
  EXPECT_EQ(error_of([&] { Mesh::create({{"", 4}}, cpu4); }), "[mesh] axis names must not be empty");
  EXPECT_NE(error_of([&] {
              Mesh::create({{"data", 1LL << 40}, {"model", 1LL << 40}}, cpu4);
            }).find("64 bits"),
            std::string::npos);
  // A platform is checked where a program is compiled for it (Platforms.BadPlatformsAreNamedWithTheFix).
  EXPECT_EQ(Mesh::create({{"data", 4}}, {"tpu", 4}).platform(), "tpu");
}

TEST(Devices, ParseMeshFlags) {
  DeviceSet cpu8{"cpu", 8};
  EXPECT_EQ(Mesh::parse("data:4,model:2", cpu8), Mesh::cpu({{"data", 4}, {"model", 2}}));
  EXPECT_EQ(Mesh::parse(" data : -1 , model:2 ", cpu8), Mesh::cpu({{"data", 4}, {"model", 2}}));
  EXPECT_EQ(Mesh::parse("{data: 2, fsdp: 2, model: 2}", cpu8), Mesh::cpu({{"data", 2}, {"fsdp", 2}, {"model", 2}}));
  EXPECT_EQ(error_of([&] { Mesh::parse("data:4,model", cpu8); }),
            "[mesh] cannot parse 'model' in the mesh 'data:4,model'; write name:size pairs separated by commas, e.g. "
            "data:4,model:2 (size -1: the remaining devices)");
  for (const char* bad : {"data=4", "data:4x", ":4", "data:", "data:4,,model:2", "data:4,"})
    EXPECT_NE(error_of([&] { Mesh::parse(bad, cpu8); }).find("[mesh] cannot parse '"), std::string::npos) << bad;
  EXPECT_NE(error_of([&] { Mesh::parse("  ", cpu8); }).find("is empty"), std::string::npos);
  EXPECT_NE(error_of([&] { Mesh::parse("data:3", cpu8); }).find("needs 3 devices but cpu:8 has 8"), std::string::npos);
  // "{data:4" parsed as an axis named "{data": an unbalanced brace is an error, and so is any axis
  // name that is not a name.
  EXPECT_EQ(error_of([&] { Mesh::parse("{data:4", cpu8); }),
            "[mesh] the mesh '{data:4' has '{' without its closing '}'; write name:size pairs separated by commas, "
            "e.g. data:4,model:2 (size -1: the remaining devices) (braces around all of it are optional)");
  EXPECT_NE(error_of([&] { Mesh::parse("data:4}", cpu8); }).find("'}' without its opening '{'"), std::string::npos);
  EXPECT_NE(error_of([&] { Mesh::parse("{", cpu8); }).find("'{' without its closing '}'"), std::string::npos);
  EXPECT_NE(error_of([&] { Mesh::parse("{}", cpu8); }).find("is empty"), std::string::npos);
  for (const char* bad : {"da ta:8", "{data}:8", "data,:8", "4data:8", "data-x:8", "'data':8"})
    EXPECT_NE(error_of([&] { Mesh::parse(bad, cpu8); }).find("[mesh]"), std::string::npos) << bad;
  EXPECT_EQ(error_of([&] { Mesh::parse("da ta:8", cpu8); }),
            "[mesh] axis name 'da ta' is not a name; axis names are letters, digits and '_', not starting with a "
            "digit (e.g. data, model, fsdp)");
  EXPECT_EQ(Mesh::parse("data_2:2,_m:4", cpu8).axis_names(), (std::vector<std::string>{"data_2", "_m"}));
}

TEST(Mesh, DeviceIdsAreInRange) {
  std::string e = error_of([] { Mesh({{"x", 2, {}}}, {0, -1}); });
  EXPECT_EQ(e,
            "[mesh] device id -1 is out of range; device ids are 0 .. 65535 (the devices' indices in PX_DEVICES, "
            "e.g. 0 .. 7 for cpu:8)");
  EXPECT_THROW(Mesh({{"x", 2, {}}}, {-2147483647 - 1, 0}), UserError);
  EXPECT_NE(error_of([] { Mesh({{"x", 1, {}}}, {65536}); }).find("device id 65536 is out of range"), std::string::npos);
  EXPECT_EQ(Mesh({{"x", 2, {}}}, {3, 1}).device_ids(), (std::vector<int>{3, 1}));
}

// Runs itself again with PX_DEVICES set: the default device set comes from the environment.
TEST(Devices, DefaultsComeFromPxDevices) {
  if (const char* v = std::getenv("PX_DEVICES_CHILD")) {
    EXPECT_EQ(default_devices().to_string(), v);
    EXPECT_EQ(Mesh::parse("data:-1,model:2").to_string(), "Mesh{data: 3, model: 2} on cpu:6");
    return;
  }
  std::string cmd = "PX_DEVICES=cpu:6 PX_DEVICES_CHILD=cpu:6 /proc/" + std::to_string(getpid()) +
                    "/exe --gtest_filter=Devices.DefaultsComeFromPxDevices > /dev/null 2>&1";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
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
