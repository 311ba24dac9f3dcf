// Backends are chosen by platform: a program compiled for a platform, and a mesh made on one, run
// their kernels on that platform's backend. A backend registered by the program (as one built out
// of tree would be) is used like the built-in ones; bad platform names fail naming the fix.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>

#include "parallax/backend.h"
#include "parallax/communicator.h"
#include "parallax/parallax.h"
#include "testing.h"

namespace px {
namespace {

// The CPU backend, counting the kernels it is asked for and the devices they are for.
class CountingBackend final : public Backend {
 public:
  std::string name() const override { return "counting"; }
  void* allocate(const Placement& p, int64_t bytes) override {
    ++allocations;
    return Backend::allocate(p, bytes);
  }
  // A stream per device, as a GPU backend has: a token the tests can recognise.
  void* stream(const Placement& device, StreamKind) override { return stream_of(device.device); }
  static void* stream_of(int device) { return reinterpret_cast<void*>(uintptr_t{0x1000} + device); }
  void copy_boxes(const std::vector<BoxCopy>& jobs) override {
    box_copies += static_cast<int>(jobs.size());
    cpu_backend().copy_boxes(jobs);
  }
  bool can_fuse(const Graph& g, const Node& n) const override { return cpu_backend().can_fuse(g, n); }
  bool has_kernel(const Primitive* prim) const override { return cpu_backend().has_kernel(prim); }
  Kernel make_kernel(const Graph& g, const Unit& unit, const Placement& device) override {
    ++kernels;
    std::lock_guard<std::mutex> l(m);
    devices.insert(device.device);
    return cpu_backend().make_kernel(g, unit, device);
  }
  int64_t scratch_bytes(const Graph& g, const Unit& unit, const Placement& device) const override {
    return cpu_backend().scratch_bytes(g, unit, device);
  }
  bool kernels_per_device() const override { return per_device; }
  Event copy(std::vector<CopyJob> jobs) override { return cpu_backend().copy(std::move(jobs)); }
  // More threads than the tests' devices: the executor runs them one after the other.
  int num_threads() const override { return 4; }
  std::atomic<int> kernels{0}, allocations{0}, box_copies{0};
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

// Arrays on a platform's devices, and the arenas of its programs, are its backend's memory,
// counted apart from other platforms'.
TEST(Platforms, ArraysAndArenasAreTheirPlatformsMemory) {
  CountingBackend& b = counting();
  const Placement at{0, MemoryKind::device, "counting"};
  const int64_t cpu_before = memory_stats({0}).allocations, before = b.allocations;
  const MemoryStats mem_before = memory_stats(at);
  {
    Array a(DType::f32, {16}, at);
    EXPECT_EQ(b.allocations, before + 1);
    EXPECT_EQ(memory_stats(at).bytes_in_use, mem_before.bytes_in_use + 64);
    EXPECT_EQ(memory_stats({0}).allocations, cpu_before);
    EXPECT_EQ(a.placement().to_string(), "counting:0/device");
  }
  EXPECT_EQ(memory_stats(at).bytes_in_use, mem_before.bytes_in_use);

  CompileOptions o;
  o.platform = "counting";
  auto exe = Executable::compile(*small_program(), o);
  EXPECT_GT(b.allocations, before + 1);  // the arena
  // A host array is copied onto the platform for the run; the result is the platform's.
  const std::vector<Array> out = exe->run({Array::from_f32(std::vector<float>(24, 0.5f), {4, 6})});
  EXPECT_EQ(out[0].placement(), at);
  EXPECT_NEAR(out[0].to_f32()[0], 6 * 2 * std::exp(0.5f), 1e-4);
  // run_into takes arrays where the program reads them, and names the copy otherwise.
  std::vector<Array> into{Array(DType::f32, {4}, at)};
  EXPECT_NE(testing::error_of([&] {
              exe->run_into({Array::from_f32(std::vector<float>(24, 0.5f), {4, 6})}, into);
            }).find("is in cpu:0/device memory but the program reads it from counting:0/device"),
            std::string::npos);
}

// Memory a platform handed out from the host before its backend registered must go back to the
// host: registering then fails, naming the fix; once it is freed, the backend registers.
TEST(Platforms, ABackendRegistersBeforeArraysAreMadeOnItsDevices) {
  static CountingBackend late;
  auto get = []() -> Backend& { return late; };
  {
    Array early(DType::f32, {4}, {0, MemoryKind::device, "late"});
    EXPECT_NE(testing::error_of([&] {
                register_backend("late", get);
              }).find("register its backend before making arrays on its devices"),
              std::string::npos);
    EXPECT_FALSE(has_backend("late"));
  }
  register_backend("late", get);
  Array a(DType::f32, {4}, {0, MemoryKind::device, "late"});
  EXPECT_EQ(late.allocations, 1);
}

// Collectives run on the streams of their devices, and the packing around one over a dim that is
// not leading runs on the backend.
TEST(Platforms, CollectivesRunOnTheirDevicesStreamsAndPackOnTheBackend) {
  CountingBackend& b = counting();
  Mesh mesh = Mesh::create({{"data", 2}}, DeviceSet{"counting", 2});
  // x split along its columns, wanted whole: an all_gather along dim 1.
  auto g = trace(
      [](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{with_sharding_constraint(in[0] * 2.0, PartitionSpec({none, none}))};
      },
      {{DType::f32, {4, 6}}});
  auto exe = ShardedExecutable::compile(*g, mesh, {PartitionSpec({none, "data"})});
  EXPECT_EQ(exe->communicator().streams(),
            (std::vector<void*>{CountingBackend::stream_of(0), CountingBackend::stream_of(1)}));
  std::vector<float> v(24);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);
  const int before = b.box_copies;
  const std::vector<float> got = exe->run_full({Array::from_f32(v, {4, 6})})[0].to_f32();
  EXPECT_GT(b.box_copies, before);
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(got[i], 2 * v[i]);
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

// A device set names a registered backend: "tpu:2", "gpu", "garbage" made devices of no backend
// (PX_DEVICES=garbage trained on the CPU); now each is refused, listing the registered platforms.
TEST(Platforms, DeviceSetsNameOnlyRegisteredPlatforms) {
  for (const char* bad : {"tpu:2", "gpu", "garbage", "cuda:2"}) {
    const std::string e = testing::error_of([&] { parse_devices(bad); });
    EXPECT_EQ(e.rfind("[devices] '" + std::string(bad) + "': no backend is registered for platform '", 0), 0u) << e;
    EXPECT_NE(e.find("the registered platforms are "), std::string::npos) << e;
    for (const std::string& p : backend_platforms()) EXPECT_NE(e.find(p), std::string::npos) << p << ": " << e;
  }
  EXPECT_NE(testing::error_of([] { parse_devices("cuda:2"); }).find("this program has no CUDA backend"), std::string::npos);
  EXPECT_NE(testing::error_of([] { parse_devices("gpu"); }).find("NVIDIA GPUs are platform 'cuda'"), std::string::npos);
  EXPECT_EQ(parse_devices("ref:2"), (DeviceSet{"ref", 2}));
  EXPECT_EQ(parse_devices(" CPU:3 "), (DeviceSet{"cpu", 3}));
  // A platform registered by the program is named from then on.
  EXPECT_NE(testing::error_of([] { parse_devices("mine:2"); }).find("no backend is registered"), std::string::npos);
  register_backend("mine", cpu_backend);
  EXPECT_EQ(parse_devices("mine:2"), (DeviceSet{"mine", 2}));
}

// A provided platform registers when a program first names it, and not before; a provider that
// cannot register it says why, in the error that names the platform.
TEST(Platforms, AProvidedPlatformRegistersWhenFirstNamed) {
  int calls = 0;
  register_platform_provider("lazy", [&calls] {
    ++calls;
    register_backend("lazy", cpu_backend);
    return std::string();
  });
  EXPECT_FALSE(has_backend("lazy"));
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(parse_devices("lazy:2"), (DeviceSet{"lazy", 2}));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(&backend_for("lazy"), &cpu_backend());
  EXPECT_EQ(calls, 1);  // registered: not provided again
  register_platform_provider("absent", [] { return std::string("no such device is visible"); });
  const std::string e = testing::error_of([] { parse_devices("absent:1"); });
  EXPECT_NE(e.find("no backend is registered for platform 'absent' (no such device is visible)"), std::string::npos) << e;
  EXPECT_NE(testing::error_of([] { backend_for("absent"); }).find("no such device is visible"), std::string::npos);
  EXPECT_FALSE(has_backend("absent"));
}

}  // namespace
}  // namespace px
