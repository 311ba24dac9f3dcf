// The cost model against reality: on virtual CPU devices the bytes of every collective kind that
// the model predicts from shapes alone equal what the runtime's communicator counts in one step,
// and the predicted per-device memory equals the compiled step's buffer plan; alpha-beta
// formulas on hand-computed cases; cluster presets, TOML errors and the calibration cache.
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "parallax/auto.h"
#include "parallax/plan.h"
#include "parallax/memory.h"
#include "parallax/nn.h"
#include "parallax/ops.h"
#include "recipe_check.h"
#include "testing.h"

namespace px {
namespace {

// The call throws a px::Error whose message contains `want`.
#define EXPECT_THROW_MSG(call, want)                                   \
  do {                                                                 \
    std::string msg_ = ::px::testing::error_of([&] { (void)(call); }); \
    EXPECT_NE(msg_.find(want), std::string::npos) << msg_;             \
  } while (0)

// A small hand-made cluster: no calibration in the tests that do not test it.
Cluster test_cluster() {
  return cluster_from_toml(R"(
name = "test"
devices_share_host = true
overlap_collectives = false
[device]
matmul_flops_f32 = 1e11
matmul_flops_bf16 = 2e11
vector_flops = 2e10
memory_bandwidth = 2e10
memory_bytes = 64e9
launch_s = 2e-6
[intra_node]
bandwidth_bytes_per_s = 1e10
latency_s = 1e-6
)",
                           "test cluster");
}

TEST(Cost, AlphaBetaOnHandComputedCases) {
  Link l{1e9, 1e-6};
  // Ring all-reduce over 4: 2(n-1)/n of the payload on the wire, 2(n-1) latency steps.
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_reduce, 4, 1000), 1500);
  // Large payloads: the ring (6 steps + 1500 bytes; the tree would take 4 steps + 2 * 1e6 bytes).
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_reduce, 4, 1000000), 1500000);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::all_reduce, 4, 1000000, l), 6e-6 + 1500000e-9);
  // Small payloads over many devices: the tree, 2 ceil(log2 n) steps and twice the payload
  // (256 devices: 16 steps instead of the ring's 510).
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::all_reduce, 4, 1000, l), 4e-6 + 2000e-9);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::all_reduce, 256, 4, l), 16e-6 + 8e-9);
  // All-gather (payload: the gathered result) and reduce-scatter over 8: (n-1)/n, n-1 steps.
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_gather, 8, 800), 700);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::all_gather, 8, 800, l), 7e-6 + 700e-9);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::reduce_scatter, 8, 800, l), 7e-6 + 700e-9);
  // All-to-all over 2 sends half; a permute sends all of it in one step.
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_to_all, 2, 100), 50);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::all_to_all, 2, 100, l), 1e-6 + 50e-9);
  EXPECT_DOUBLE_EQ(collective_seconds(CollectiveKind::permute, 2, 64, l), 1e-6 + 64e-9);
  // A group of one moves nothing.
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_reduce, 1, 1000), 0);
  EXPECT_EQ(collective_seconds(CollectiveKind::all_reduce, 1, 1000, l), 0);
  // The same integer rounding as the communicator's counters (payload * num / den).
  EXPECT_EQ(collective_wire_bytes(CollectiveKind::all_reduce, 3, 100), 133);
}

// Virtual devices: a collective is copies through the host's memory by every device at once, at
// the measured rate of its kind per device of two, and n - 1 latencies.
TEST(Cost, InProcessCollectivesAreCopiesThroughTheSharedHost) {
  const Link l{1e9, 1e-6};
  InProcessRates r;
  EXPECT_FALSE(r.known());
  EXPECT_THROW_MSG(in_process_collective_seconds(CollectiveKind::all_reduce, 2, 2, 1000, l, r), "calibrate");
  r = {.all_reduce = 4e9, .all_gather = 2e9, .reduce_scatter = 8e9, .all_to_all = 1e9};
  ASSERT_TRUE(r.known());
  const int64_t P = 8000000;
  // Two devices: the rate as measured.
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::all_reduce, 2, 2, P, l, r), 1e-6 + P / 4e9);
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::all_gather, 2, 2, P, l, r), 1e-6 + P / 2e9);
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::reduce_scatter, 2, 2, P, l, r), 1e-6 + P / 8e9);
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::all_to_all, 2, 2, P, l, r), 1e-6 + P / 1e9);
  // Eight devices on the host share its memory: 4x the time of two, whatever the group (an
  // all-reduce reads and writes each device's payload once in one pass, not 2(n-1)/n of it in
  // 2(n-1) steps as a ring).
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::all_reduce, 8, 8, P, l, r), 7e-6 + 4.0 * P / 4e9);
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::all_gather, 2, 8, P, l, r), 1e-6 + 4.0 * P / 2e9);
  // A reduce-scatter reads the payload and writes 1/n of it: (n + 2) / 2n of two devices' traffic.
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::reduce_scatter, 8, 8, P, l, r),
                   7e-6 + 10.0 / 16.0 * 4.0 * P / 8e9);
  EXPECT_DOUBLE_EQ(in_process_collective_seconds(CollectiveKind::permute, 2, 4, P, l, r), 1e-6 + 2.0 * P / 1e9);
  EXPECT_EQ(in_process_collective_seconds(CollectiveKind::all_gather, 1, 8, P, l, r), 0);

  // The cost model takes them for a cluster whose devices share the host: DDP over 8 devices is
  // all-reduces over all 8, FSDP all-gathers and reduce-scatters over 8.
  Cluster c = test_cluster();
  c.in_process = r;
  const Mesh mesh = c.apply(Mesh::cpu({{"data", 8}}));
  StepSetup setup;
  setup.batch = 8;
  setup.seq = 16;
  auto rc = cost_recipes(recipe_check::gpt_micro(), mesh, c, setup, {ShardingStrategy::DDP, ShardingStrategy::FSDP});
  ASSERT_TRUE(rc[0].applies && rc[1].applies);
  auto expect = [&](const StepCost& cost, CollectiveKind k, double steps, double traffic, double rate) {
    const StepCost::Comm& e = cost.collectives[static_cast<int>(k)];
    SCOPED_TRACE(collective_name(k));
    ASSERT_GT(e.calls, 0);
    EXPECT_NEAR(e.seconds, e.calls * steps * c.intra_node.latency_s + e.payload_bytes * traffic * 4.0 / rate,
                1e-9 * e.seconds);
  };
  expect(rc[0].cost, CollectiveKind::all_reduce, 7, 1, r.all_reduce);
  expect(rc[1].cost, CollectiveKind::all_gather, 7, 1, r.all_gather);
  expect(rc[1].cost, CollectiveKind::reduce_scatter, 7, 10.0 / 16.0, r.reduce_scatter);
  // Without the rates (a file that has none): the links' ring model, as for real links.
  c.in_process = {};
  auto ring = cost_recipes(recipe_check::gpt_micro(), mesh, c, setup, {ShardingStrategy::DDP});
  const StepCost::Comm& ar = ring[0].cost.collectives[static_cast<int>(CollectiveKind::all_reduce)];
  EXPECT_NE(ar.seconds, rc[0].cost.collectives[static_cast<int>(CollectiveKind::all_reduce)].seconds);
}

TEST(Cost, GpuPresetsPutInnerAxesOnNvlinkAndOuterOnInfiniband) {
  Cluster h = cluster_preset("h100x8");
  EXPECT_EQ(h.devices_per_node, 8);
  EXPECT_EQ(h.device.memory_bytes, int64_t{80} * 1000 * 1000 * 1000);
  EXPECT_GT(cluster_preset("h200x8").device.memory_bandwidth, h.device.memory_bandwidth);
  Mesh m = h.apply(Mesh::parse("data:32,model:8", DeviceSet{"cpu", 256}));
  EXPECT_EQ(m.axes()[1].link.bandwidth_bytes_per_s, h.intra_node.bandwidth_bytes_per_s);  // model: inside a node
  EXPECT_EQ(m.axes()[0].link.bandwidth_bytes_per_s, h.inter_node.bandwidth_bytes_per_s);  // data: across nodes
  Mesh small = h.apply(Mesh::parse("data:4,model:2", DeviceSet{"cpu", 8}));
  for (const auto& a : small.axes()) EXPECT_EQ(a.link.bandwidth_bytes_per_s, h.intra_node.bandwidth_bytes_per_s);
  Mesh wide = h.apply(Mesh::parse("data:16,model:16", DeviceSet{"cpu", 256}));  // a model group spans 2 nodes
  EXPECT_EQ(wide.axes()[1].link.bandwidth_bytes_per_s, h.inter_node.bandwidth_bytes_per_s);
  EXPECT_THROW_MSG(cluster_preset("tpu"), "h100x8");
  // The TPU-v4-like pod: every axis of a 1024-chip mesh on the interconnect, 32 GiB per chip.
  Cluster t = cluster_preset("tpuv4");
  EXPECT_EQ(t.device.memory_bytes, int64_t{32} << 30);
  Mesh pod = t.apply(Mesh::parse("data:16,fsdp:16,model:4", DeviceSet{"cpu", 1024}));
  for (const auto& a : pod.axes()) EXPECT_EQ(a.link.bandwidth_bytes_per_s, t.intra_node.bandwidth_bytes_per_s);
  EXPECT_EQ(cluster_from_toml(t.to_toml()).intra_node.bandwidth_bytes_per_s, t.intra_node.bandwidth_bytes_per_s);
}

TEST(Cost, ClusterTomlRoundTripsAndNamesTheAxisLinks) {
  Cluster c = cluster_from_toml(R"(
name = "two_nodes"
devices_per_node = 4
[device]
matmul_flops_f32 = 1e12
memory_bandwidth = 1e11
memory_bytes = 16000000000
[intra_node]
bandwidth_bytes_per_s = 1e11
latency_s = 2e-6
[inter_node]
bandwidth_bytes_per_s = 1e10
latency_s = 1e-5
[axis.pipe]
bandwidth_bytes_per_s = 5e9
latency_s = 0
)");
  EXPECT_EQ(c.name, "two_nodes");
  EXPECT_EQ(c.device.matmul_flops_bf16, 1e12);  // defaults to the f32 rate
  EXPECT_EQ(c.device.vector_flops, 1e12);
  EXPECT_EQ(c.device.memory_bytes, 16000000000);
  Mesh m = c.apply(Mesh::parse("pipe:2,data:4", DeviceSet{"cpu", 8}));
  EXPECT_EQ(m.axes()[0].link.bandwidth_bytes_per_s, 5e9);   // named
  EXPECT_EQ(m.axes()[1].link.bandwidth_bytes_per_s, 1e11);  // one node of 4
  Cluster back = cluster_from_toml(c.to_toml(), "round trip");
  EXPECT_EQ(back.to_toml(), c.to_toml());
  EXPECT_EQ(back.axis_links.at("pipe").bandwidth_bytes_per_s, 5e9);
  EXPECT_EQ(back.inter_node.latency_s, 1e-5);

  // Virtual devices with measured in-process collectives.
  Cluster v = test_cluster();
  v.in_process = {.all_reduce = 7e9, .all_gather = 8.5e9, .reduce_scatter = 1.1e10, .all_to_all = 6.5e9};
  Cluster vb = cluster_from_toml(v.to_toml(), "round trip");
  EXPECT_EQ(vb.to_toml(), v.to_toml());
  EXPECT_EQ(vb.in_process.reduce_scatter, 1.1e10);
}

TEST(Cost, BadClusterTomlSaysWhichKeyAndHowToFixIt) {
  const std::string links = "[intra_node]\nbandwidth_bytes_per_s = 1e9\nlatency_s = 1e-6\n";
  const std::string dev = "[device]\nmatmul_flops_f32 = 1e12\nmemory_bandwidth = 1e11\nmemory_bytes = 8e9\n";
  EXPECT_THROW_MSG(cluster_from_toml(links, "a.toml"), "a.toml: the [device] section is missing");
  EXPECT_THROW_MSG(cluster_from_toml(dev + "memory_bw = 3\n" + links, "a.toml"),
                   "unknown key 'device.memory_bw'; the keys of [device] are matmul_flops_f32");
  EXPECT_THROW_MSG(cluster_from_toml("[device]\nmatmul_flops_f32 = 1e12\nmemory_bytes = 8e9\n" + links, "a.toml"),
                   "device.memory_bandwidth is missing; add it under [device], e.g. memory_bandwidth = ");
  EXPECT_THROW_MSG(cluster_from_toml("[device]\nmatmul_flops_f32 = \"fast\"\nmemory_bandwidth = 1e11\n"
                                     "memory_bytes = 8e9\n" +
                                         links,
                                     "a.toml"),
                   "device.matmul_flops_f32 must be a number, e.g. matmul_flops_f32 = 67e12");
  EXPECT_THROW_MSG(cluster_from_toml("[device]\nmatmul_flops_f32 = -1\nmemory_bandwidth = 1e11\n"
                                     "memory_bytes = 8e9\n" +
                                         links,
                                     "a.toml"),
                   "device.matmul_flops_f32 must be positive");
  EXPECT_THROW_MSG(cluster_from_toml(dev, "a.toml"), "the [intra_node] section is missing");
  EXPECT_THROW_MSG(cluster_from_toml("devices_per_node = 8\n" + dev + links, "a.toml"),
                   "devices_per_node = 8 but the [inter_node] section is missing");
  EXPECT_THROW_MSG(cluster_from_toml(dev + "[intra_node]\nbandwidth_bytes_per_s = 1e9\n", "a.toml"),
                   "intra_node.latency_s is missing");
  EXPECT_THROW_MSG(cluster_from_toml("name = \n", "a.toml"), "a.toml: not valid TOML at line 1");
  EXPECT_THROW_MSG(cluster_from_toml("devices_per_node = \"eight\"\n" + dev + links, "a.toml"),
                   "devices_per_node must be an integer, e.g. devices_per_node = 8");
  EXPECT_THROW_MSG(read_cluster_file("/nonexistent/c.toml"), "cannot read the cluster file '/nonexistent/c.toml'");
  EXPECT_THROW_MSG(load_cluster("h300x8"), "unknown cluster preset 'h300x8'");
  const std::string rates = "[in_process]\nall_reduce = 7e9\nall_gather = 8e9\nreduce_scatter = 1e10\n";
  EXPECT_THROW_MSG(cluster_from_toml("devices_share_host = true\n" + dev + links + rates, "a.toml"),
                   "in_process.all_to_all is missing; add it under [in_process], e.g. all_to_all = ");
  EXPECT_THROW_MSG(cluster_from_toml(dev + links + rates + "all_to_all = 6e9\n", "a.toml"),
                   "but devices_share_host is false; set devices_share_host = true or remove [in_process]");
}

// The calibration is measured once, cached under $XDG_CACHE_HOME/parallax, read back unchanged,
// and measured again when the cache comes from another host or when asked to.
TEST(Cost, CpuCalibrationIsCachedAndRecalibrated) {
  auto dir = std::filesystem::temp_directory_path() / ("px_cost_cache_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const char* old = std::getenv("XDG_CACHE_HOME");
  std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  ::unsetenv("PX_RECALIBRATE");
  const std::string path = cluster_cache_path();
  // cpu_cluster-<threads>threads.toml; sanitized and debug builds keep their own (...-sanitized.toml).
  const std::string stem = (dir / "parallax" / "cpu_cluster").string();
  EXPECT_EQ(path.rfind(stem, 0), 0u) << path;
  EXPECT_EQ(path.substr(path.size() - 5), ".toml") << path;

  Cluster a = cpu_cluster();
  ASSERT_TRUE(std::filesystem::exists(path));
  EXPECT_TRUE(a.devices_share_host);
  EXPECT_FALSE(a.overlap_collectives);
  EXPECT_GT(a.device.matmul_flops_f32, 1e8);
  EXPECT_GT(a.device.memory_bandwidth, 1e8);
  EXPECT_GT(a.intra_node.latency_s, 0);
  EXPECT_TRUE(a.in_process.known());
  EXPECT_NE(a.source.find("calibrated on"), std::string::npos);
  Cluster b = cpu_cluster();  // from the file: the same figures
  EXPECT_EQ(b.to_toml(), a.to_toml());
  EXPECT_EQ(cluster_preset("cpu").to_toml(), a.to_toml());

  // A cache written on another host is measured again (and rewritten for this one).
  std::string text;
  {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  size_t at = text.find("calibrated on ");
  ASSERT_NE(at, std::string::npos);
  text.insert(at + 14, "another-host ");
  {
    std::ofstream out(path);
    out << text;
  }
  EXPECT_NE(read_cluster_file(path).source, a.source);
  Cluster c = cpu_cluster();
  EXPECT_EQ(c.source, a.source);
  EXPECT_EQ(read_cluster_file(path).source, a.source);
  Cluster d = cpu_cluster(/*recalibrate=*/true);
  EXPECT_EQ(read_cluster_file(path).to_toml(), d.to_toml());
  // A cache from before the in-process collectives were measured is measured again.
  {
    Cluster old_cache = d;
    old_cache.in_process = {};
    std::ofstream out(path);
    out << old_cache.to_toml();
  }
  EXPECT_FALSE(read_cluster_file(path).in_process.known());
  EXPECT_TRUE(cpu_cluster().in_process.known());
  EXPECT_TRUE(read_cluster_file(path).in_process.known());

  if (old)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

// Each platform is calibrated through its own backend and cached apart: ref's plain loops measure
// far slower matmuls than the CPU backend's oneDNN, and a plan for a ref mesh can be costed on it.
TEST(Cost, EachPlatformIsCalibratedThroughItsBackend) {
  auto dir = std::filesystem::temp_directory_path() / ("px_cost_platforms_" + std::to_string(::getpid()));
  const char* old = std::getenv("XDG_CACHE_HOME");
  const std::string saved = old ? old : "";
  ::setenv("XDG_CACHE_HOME", dir.c_str(), 1);
  ::unsetenv("PX_RECALIBRATE");
  EXPECT_NE(cluster_cache_path("ref"), cluster_cache_path("cpu"));
  EXPECT_NE(cluster_cache_path("ref").find("ref_cluster-1threads"), std::string::npos) << cluster_cache_path("ref");
  const Cluster ref = load_cluster("ref"), cpu = load_cluster("cpu");
  EXPECT_EQ(ref.name, "ref");
  EXPECT_TRUE(std::filesystem::exists(cluster_cache_path("ref")));
  EXPECT_GT(ref.device.matmul_flops_f32, 1e6);
  EXPECT_LT(ref.device.matmul_flops_f32 * 5, cpu.device.matmul_flops_f32);
  EXPECT_TRUE(ref.in_process.known());
  const std::vector<std::string> presets = cluster_preset_names();
  EXPECT_NE(std::find(presets.begin(), presets.end(), "ref"), presets.end());
  EXPECT_NE(testing::error_of([] { calibrate("tpu"); }).find("no backend for platform 'tpu'"), std::string::npos);
  if (old)
    ::setenv("XDG_CACHE_HOME", saved.c_str(), 1);
  else
    ::unsetenv("XDG_CACHE_HOME");
  std::filesystem::remove_all(dir);
}

// One matmul on one device: the roofline by hand.
TEST(Cost, ComputeIsTheRooflineOfEachKernel) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                 {{DType::f32, {256, 512}}, {DType::f32, {512, 128}}});
  Mesh mesh = Mesh::cpu({{"data", 1}});
  SpmdProgram p = partition(*g, mesh, {Sharding::replicated(mesh), Sharding::replicated(mesh)});
  Cluster c = test_cluster();
  StepCost s = cost_program(p, c);
  const double flops = 2.0 * 256 * 512 * 128, bytes = (256 * 512 + 512 * 128 + 256 * 128) * 4.0;
  EXPECT_EQ(s.kernels, 1);
  EXPECT_DOUBLE_EQ(s.flops, flops);
  EXPECT_DOUBLE_EQ(s.matmul_flops, flops);
  EXPECT_DOUBLE_EQ(s.compute_s, std::max(flops / 1e11, bytes / 2e10) + 2e-6);
  EXPECT_EQ(s.comm_s, 0);
  EXPECT_DOUBLE_EQ(s.step_s, s.compute_s);
  // Matmul FLOPs at the matmul rate of their operands' dtype, the rest at the vector rate.
  const DeviceSpec& d = c.device;
  EXPECT_DOUBLE_EQ(d.kernel_seconds(3e10, 1e10, DType::bf16, 0), 1e10 / 2e11 + 2e10 / 2e10 + 2e-6);
  EXPECT_DOUBLE_EQ(d.kernel_seconds(3e10, 1e10, DType::f32, 0), 1e10 / 1e11 + 2e10 / 2e10 + 2e-6);
  EXPECT_DOUBLE_EQ(d.kernel_seconds(1e6, 0, DType::f32, 4e10), 4e10 / 2e10 + 2e-6);  // memory-bound
  // bf16 operands run at the bf16 rate.
  CompileOptions bf;
  bf.compute_dtype = DType::bf16;
  StepCost h = cost_program(p, c, bf);
  EXPECT_LT(h.compute_s, s.compute_s + 1e-12);
}

struct Case {
  ShardingStrategy strategy;
  std::vector<std::pair<std::string, int64_t>> mesh;
  DType compute = DType::f32;
};

// bench-gpt's widths with 2 layers on cpu:8: what the model predicts from shapes alone equals
// what the runtime counts and plans, collective kind by kind and category by category.
TEST(Cost, PredictedCollectiveBytesAndPeakEqualTheRuntimeOnCpu8) {
  const nn::LmConfig cfg = nn::gpt2_config("bench_gpt_2", 8192, 512, 8, 2, 2048, 64);
  const Cluster cluster = test_cluster();
  const std::vector<Case> cases = {
      {ShardingStrategy::DDP, {{"data", 8}}},
      {ShardingStrategy::FSDP, {{"data", 8}}},
      {ShardingStrategy::TP, {{"data", 4}, {"model", 2}}},
      {ShardingStrategy::FSDP_TP, {{"data", 4}, {"model", 2}}},
      {ShardingStrategy::FSDP, {{"data", 8}}, DType::bf16},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(std::string(strategy_name(k.strategy)) + (k.compute == DType::bf16 ? " bf16" : ""));
    Mesh mesh = cluster.apply(Mesh::cpu(k.mesh));
    StepSetup setup;
    setup.batch = 8;
    setup.seq = 64;
    setup.optimizer = recipe_check::opt();
    setup.compute_dtype = k.compute;
    std::vector<RecipeCost> rc = cost_recipes(cfg, mesh, cluster, setup, {k.strategy});
    ASSERT_EQ(rc.size(), 1u);
    ASSERT_TRUE(rc[0].applies) << rc[0].reason;
    const StepCost& pred = rc[0].cost;

    recipe_check::Fixture f(cfg);
    TrainStepOptions o;
    o.compile.compute_dtype = k.compute;
    TrainStep step(f.model.store(), recipe_check::opt(), f.loss, f.batch_types,
                   px::testing::on_mesh(mesh, k.strategy, {}, o));
    const MemoryReport mem = step.program().memory();
    EXPECT_EQ(pred.memory.peak_bytes, mem.peak_bytes);
    EXPECT_EQ(pred.memory.arena_bytes, mem.arena_bytes);
    EXPECT_EQ(pred.memory.input_bytes, mem.input_bytes);
    EXPECT_EQ(pred.memory.output_bytes, mem.output_bytes);
    EXPECT_EQ(pred.memory.by_category, mem.by_category);
    // Params and optimizer state are named as such (bf16 compute included: autocast keeps them).
    EXPECT_GT(pred.memory.by_category[static_cast<int>(MemoryCategory::params)], 0);
    EXPECT_GT(pred.memory.by_category[static_cast<int>(MemoryCategory::optimizer_state)], 0);
    EXPECT_EQ(pred.memory.arena_max_by_category, mem.arena_max_by_category);
    // The compiled program costed directly gives the same prediction.
    StepCost direct = cost_program(step.program().program(), cluster, o.compile);
    EXPECT_EQ(direct.memory.peak_bytes, mem.peak_bytes);
    EXPECT_DOUBLE_EQ(direct.step_s, pred.step_s);

    TrainState st = step.init(0);
    step.program().reset_stats();
    EXPECT_TRUE(std::isfinite(step(st, f.batch(0)).loss));
    const CollectiveStats& stats = step.program().stats();
    int kinds = 0;
    for (int c = 0; c < kNumCollectiveKinds; ++c) {
      const auto kind = static_cast<CollectiveKind>(c);
      SCOPED_TRACE(collective_name(kind));
      const StepCost::Comm& p = pred.collectives[c];
      kinds += p.calls > 0;
      for (int d = 0; d < mesh.size(); ++d) {
        EXPECT_EQ(stats.at(d, kind).calls, p.calls);
        EXPECT_EQ(stats.at(d, kind).payload_bytes, p.payload_bytes);
        EXPECT_EQ(stats.at(d, kind).wire_bytes, p.wire_bytes);
      }
    }
    EXPECT_GT(kinds, 0);
    // The in-process cluster runs collectives at their start, on the compute cores.
    EXPECT_NEAR(pred.step_s, pred.compute_s + pred.comm_s, 1e-12 * pred.step_s);
    if (k.strategy == ShardingStrategy::FSDP && k.compute == DType::f32) {
      EXPECT_GT(pred.collectives[static_cast<int>(CollectiveKind::all_gather)].calls, 0);
      EXPECT_GT(pred.collectives[static_cast<int>(CollectiveKind::reduce_scatter)].calls, 0);
      // With collectives beside compute the step is shorter, never shorter than either part.
      Cluster overlapped = cluster;
      overlapped.overlap_collectives = true;
      StepCost o2 = cost_program(step.program().program(), overlapped);
      EXPECT_LT(o2.step_s, pred.step_s);
      EXPECT_GE(o2.step_s, std::max(o2.compute_s, o2.comm_s) - 1e-15);
    }
  }
}

TEST(Cost, ARecipeThatDoesNotApplyIsReportedNotThrown) {
  Cluster c = test_cluster();
  Mesh mesh = c.apply(Mesh::cpu({{"data", 2}}));
  StepSetup setup;
  setup.batch = 2;
  setup.seq = 16;
  auto r = cost_recipes(recipe_check::gpt_micro(), mesh, c, setup);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_TRUE(r[0].applies) << r[0].reason;  // DDP
  EXPECT_TRUE(r[1].applies) << r[1].reason;  // FSDP
  EXPECT_FALSE(r[2].applies);                // TP: no model axis
  EXPECT_NE(r[2].reason.find("needs the model axis 'model'"), std::string::npos) << r[2].reason;
  EXPECT_FALSE(r[3].applies);
  // A batch that does not divide over the data axis.
  setup.batch = 3;
  auto odd = cost_recipes(recipe_check::gpt_micro(), mesh, c, setup, {ShardingStrategy::DDP});
  EXPECT_FALSE(odd[0].applies);
  EXPECT_NE(odd[0].reason.find("does not divide"), std::string::npos) << odd[0].reason;
}

// A 1B-parameter model costed on 32 devices from shapes: nothing near its 4 GB of params is
// allocated, and the memory it would need is reported against the device's capacity.
TEST(Cost, PlansABillionParameterModelWithoutAllocatingIt) {
  const nn::LmConfig cfg = nn::gpt2_config("1b", 32000, 2560, 20, 13, 10240, 1024);
  Cluster h = cluster_preset("h100x8");
  Mesh mesh = h.apply(Mesh::parse("data:16,model:2", DeviceSet{"cpu", 32}));
  StepSetup setup;
  setup.batch = 32;
  setup.seq = 1024;
  setup.compute_dtype = DType::bf16;
  reset_peak_memory({0});
  const int64_t before = memory_stats({0}).bytes_in_use;
  auto r = cost_recipes(cfg, mesh, h, setup, {ShardingStrategy::FSDP});
  ASSERT_TRUE(r[0].applies) << r[0].reason;
  EXPECT_LT(memory_stats({0}).peak_bytes_in_use - before, int64_t{64} << 20);
  const StepCost& s = r[0].cost;
  EXPECT_GT(s.memory.peak_bytes, int64_t{1} << 30);
  EXPECT_EQ(s.memory_capacity, h.device.memory_bytes);
  EXPECT_TRUE(s.fits());
  EXPECT_GT(s.compute_s, 0);
  EXPECT_GT(s.comm_s, 0);
  std::cout << s.to_string();
}

}  // namespace
}  // namespace px
