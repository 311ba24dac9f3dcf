// Backends are chosen by platform: a program compiled for a platform, and a mesh made on one, run
// their kernels on that platform's backend. A backend registered by the program (as one built out
// of tree would be) is used like the built-in ones; bad platform names fail naming the fix.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>

#include "parallax/backend.h"
#include "parallax/parallax.h"
#include "testing.h"

namespace px {
namespace {

// The CPU backend, counting the kernels it is asked for and the devices they are for.
class CountingBackend final : public Backend {
 public:
  std::string name() const override { return "counting"; }
  void* allocate(const Placement& p, int64_t bytes) override { return cpu_backend().allocate(p, bytes); }
  void free(const Placement& p, void* ptr, int64_t bytes) override { cpu_backend().free(p, ptr, bytes); }
  bool can_fuse(const Graph& g, const Node& n) const override { return cpu_backend().can_fuse(g, n); }
  bool has_kernel(const std::string& prim) const override { return cpu_backend().has_kernel(prim); }
  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& device) override {
    ++kernels;
    std::lock_guard<std::mutex> l(m);
    devices.insert(device.device);
    return cpu_backend().make_kernel(g, unit, device);
  }
  bool kernels_per_device() const override { return per_device; }
  Event copy(std::vector<CopyJob> jobs) override { return cpu_backend().copy(std::move(jobs)); }
  // More threads than the tests' devices: the executor runs them one after the other.
  int num_threads() const override { return 4; }
  std::atomic<int> kernels{0};
  std::mutex m;
  std::set<int> devices;
  bool per_device = false;
};

CountingBackend& counting() {
  static CountingBackend b;
  static const bool registered = (register_backend("counting", []() -> Backend& { return b; }), true);
  (void)registered;
  return b;
}

std::unique_ptr<Graph> small_program() {
  return trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(exp(in[0]) * 2.0, {1})}; },
               {{DType::f32, {4, 6}}});
}

TEST(Platforms, AProgramRunsOnThePlatformItIsCompiledFor) {
  CountingBackend& b = counting();
  const int before = b.kernels;
  CompileOptions o;
  o.platform = "counting";
  auto exe = Executable::compile(*small_program(), o);
  EXPECT_GT(b.kernels, before);
  Array x = Array::from_f32(std::vector<float>(24, 0.5f), {4, 6});
  const float want = 6 * 2 * std::exp(0.5f);
  for (float v : exe->run({x})[0].to_f32()) EXPECT_NEAR(v, want, 1e-4);
}

TEST(Platforms, AMeshOnAPlatformRunsItsProgramsThere) {
  CountingBackend& b = counting();
  const int before = b.kernels;
  Mesh mesh = Mesh::create({{"data", 2}}, DeviceSet{"counting", 2});
  EXPECT_EQ(mesh.platform(), "counting");
  auto exe = ShardedExecutable::compile(*small_program(), mesh, {PartitionSpec({"data"})});
  EXPECT_GT(b.kernels, before);
}

// Devices run one after the other share kernel instances unless the backend binds each device into
// its own (a device's stream): then every device's kernels are made for it.
TEST(Platforms, KernelsAreMadeForTheirDevice) {
  CountingBackend& b = counting();
  Mesh mesh = Mesh::create({{"data", 2}}, DeviceSet{"counting", 2});
  for (bool per_device : {false, true}) {
    b.per_device = per_device;
    b.devices.clear();
    auto exe = ShardedExecutable::compile(*small_program(), mesh, {PartitionSpec({"data"})});
    EXPECT_EQ(b.devices, per_device ? std::set<int>({0, 1}) : std::set<int>({0}));
    Array x = Array::from_f32(std::vector<float>(24, 0.5f), {4, 6});
    const float want = 6 * 2 * std::exp(0.5f);
    for (float v : gather(exe->run({shard(x, exe->in_sharding(0))})[0]).to_f32())
      EXPECT_NEAR(v, want, 1e-4);
  }
  b.per_device = false;
}

TEST(Platforms, BuiltInPlatformsAreListed) {
  const std::vector<std::string> p = backend_platforms();
  EXPECT_NE(std::find(p.begin(), p.end(), "cpu"), p.end());
  EXPECT_TRUE(has_backend("cpu"));
  EXPECT_FALSE(has_backend("tpu"));
}

TEST(Platforms, BadPlatformsAreNamedWithTheFix) {
  CompileOptions o;
  o.platform = "tpu";
  EXPECT_NE(testing::error_of([&] {
              Executable::compile(*small_program(), o);
            }).find("[backend] no backend for platform 'tpu'; the registered platforms are "),
            std::string::npos);
  // A mesh on it is made (a backend may be registered later) and fails where its program compiles.
  const Mesh tpu = Mesh::create({{"data", 2}}, DeviceSet{"tpu", 2});
  EXPECT_NE(testing::error_of([&] {
              ShardedExecutable::compile(*small_program(), tpu, {PartitionSpec({"data"})});
            }).find("[backend] no backend for platform 'tpu'"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { register_backend("cpu", cpu_backend); }).find("registered twice"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { register_backend("My GPU", cpu_backend); }).find("is not valid"), std::string::npos);
}

}  // namespace
}  // namespace px
