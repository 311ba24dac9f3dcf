// Cluster descriptions: presets, TOML files, and this machine's devices of a platform (cpu, ref)
// calibrated by a short measurement through that platform's backend and cached.
#include <omp.h>
#include <unistd.h>

#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/env.h"
#include "io/regular_file.h"
#include "io/toml_guard.h"
#include "ir/primitive.h"
#include "parallax/auto.h"
#include "parallax/backend.h"
#include "parallax/communicator.h"
#include "parallax/ops.h"
#include "parallax/parallel.h"

namespace px {

double DeviceSpec::matmul_flops(DType operands) const {
  return operands == DType::bf16 || operands == DType::f16 ? matmul_flops_bf16 : matmul_flops_f32;
}

double DeviceSpec::kernel_seconds(double flops, double matmul, DType operands, double bytes) const {
  double compute = (matmul > 0 ? matmul / matmul_flops(operands) : 0) + (flops - matmul) / vector_flops;
  return std::max(compute, bytes / memory_bandwidth) + launch_s;
}

Link Cluster::axis_link(const Mesh& mesh, int axis) const {
  const MeshAxis& a = mesh.axes().at(axis);
  if (auto it = axis_links.find(a.name); it != axis_links.end()) return it->second;
  if (devices_per_node <= 0) return intra_node;
  // Positions along the axis are `stride` apart: a group spans stride * (size - 1) + 1 positions
  // starting at a multiple of stride * size, so it stays in one node when stride * size divides
  // into the node.
  int64_t stride = 1;
  for (int k = axis + 1; k < mesh.rank(); ++k) stride *= mesh.axes()[k].size;
  int64_t span = stride * a.size;
  return span <= devices_per_node && devices_per_node % span == 0 ? intra_node : inter_node;
}

Mesh Cluster::apply(const Mesh& mesh) const {
  std::vector<MeshAxis> axes = mesh.axes();
  for (int k = 0; k < mesh.rank(); ++k) {
    axes[k].link = axis_link(mesh, k);
    // Virtual devices' collectives are copies through the host's memory, all devices' at once.
    if (devices_share_host && mesh.size() > 1) axes[k].link.bandwidth_bytes_per_s /= static_cast<double>(mesh.size());
  }
  return Mesh(axes, mesh.device_ids(), mesh.platform());
}

DeviceSpec Cluster::device_on(const Mesh& mesh) const {
  DeviceSpec d = device;
  if (devices_share_host && mesh.size() > 1) {
    const double n = static_cast<double>(mesh.size());
    d.matmul_flops_f32 /= n;
    d.matmul_flops_bf16 /= n;
    d.vector_flops /= n;
    d.memory_bandwidth /= n;
    d.memory_bytes /= mesh.size();
  }
  return d;
}

std::string Cluster::to_string() const {
  std::ostringstream os;
  os << name << ": matmul " << device.matmul_flops_f32 / 1e12 << " TFLOP/s f32, " << device.matmul_flops_bf16 / 1e12
     << " bf16; vector " << device.vector_flops / 1e12 << " TFLOP/s; memory " << device.memory_bandwidth / 1e9
     << " GB/s, " << device.memory_bytes / 1e9 << " GB; links " << intra_node.bandwidth_bytes_per_s / 1e9 << " GB/s "
     << intra_node.latency_s * 1e6 << " us inside a node";
  if (devices_per_node > 0)
    os << " of " << devices_per_node << ", " << inter_node.bandwidth_bytes_per_s / 1e9 << " GB/s "
       << inter_node.latency_s * 1e6 << " us across";
  if (devices_share_host) os << " (virtual devices share the host)";
  if (in_process.known())
    os << "; in-process all_reduce " << in_process.all_reduce / 1e9 << ", all_gather " << in_process.all_gather / 1e9
       << ", reduce_scatter " << in_process.reduce_scatter / 1e9 << ", all_to_all " << in_process.all_to_all / 1e9
       << " GB/s per device of two";
  if (!source.empty()) os << " [" << source << "]";
  return os.str();
}

namespace {

toml::table link_table(const Link& l) {
  return toml::table{{"bandwidth_bytes_per_s", l.bandwidth_bytes_per_s}, {"latency_s", l.latency_s}};
}

}  // namespace

std::string Cluster::to_toml() const {
  toml::table t;
  t.insert("name", name);
  if (!source.empty()) t.insert("source", source);
  t.insert("devices_per_node", devices_per_node);
  t.insert("devices_share_host", devices_share_host);
  t.insert("overlap_collectives", overlap_collectives);
  t.insert("device", toml::table{{"matmul_flops_f32", device.matmul_flops_f32},
                                 {"matmul_flops_bf16", device.matmul_flops_bf16},
                                 {"vector_flops", device.vector_flops},
                                 {"memory_bandwidth", device.memory_bandwidth},
                                 {"memory_bytes", device.memory_bytes},
                                 {"launch_s", device.launch_s},
                                 {"host_link_bandwidth", device.host_link_bandwidth}});
  t.insert("intra_node", link_table(intra_node));
  t.insert("inter_node", link_table(inter_node));
  if (in_process.known())
    t.insert("in_process", toml::table{{"all_reduce", in_process.all_reduce},
                                       {"all_gather", in_process.all_gather},
                                       {"reduce_scatter", in_process.reduce_scatter},
                                       {"all_to_all", in_process.all_to_all}});
  if (!axis_links.empty()) {
    toml::table axes;
    for (const auto& [n, l] : axis_links) axes.insert(n, link_table(l));
    t.insert("axis", std::move(axes));
  }
  std::ostringstream os;
  os << t << "\n";
  return os.str();
}

// ---- Presets ------------------------------------------------------------------------------

namespace {

// Sustained fractions of the datasheet peaks (assumptions, not datasheet figures): large bf16
// GEMMs reach about 70% of the dense tensor-core peak, streaming kernels about 85% of HBM
// bandwidth, NCCL rings about 80% of NVLink's and 90% of InfiniBand's per-direction bandwidth.
constexpr double kMatmulEff = 0.70, kHbmEff = 0.85, kNvlinkEff = 0.80, kIbEff = 0.90;

// An 8-GPU HGX/DGX node of H100 or H200 SXM GPUs. Figures from the NVIDIA H100 Tensor Core GPU
// datasheet and the NVIDIA H200 Tensor Core GPU datasheet (SXM form factor): FP32 67 TFLOPS;
// BF16 tensor core 1,979 TFLOPS with sparsity, i.e. 989 TFLOPS dense; NVLink 900 GB/s per GPU
// (both directions, 450 GB/s each way); H100 80 GB HBM3 at 3.35 TB/s, H200 141 GB HBM3e at
// 4.8 TB/s. Between nodes: one NVIDIA ConnectX-7 NDR InfiniBand adapter of 400 Gb/s (50 GB/s each
// way) per GPU, as in the DGX H100 / DGX H200 system datasheets. Latencies (not on datasheets):
// about 3 us per ring step over NVLink and 6 us over InfiniBand, typical of NCCL; a kernel launch
// 4 us. Host memory (offload) over PCIe Gen5 x16: 64 GB/s each way.
Cluster hopper_node(const std::string& name, double hbm_bytes_per_s, int64_t hbm_bytes) {
  Cluster c;
  c.name = name;
  c.device.matmul_flops_f32 = 67e12 * kMatmulEff;
  c.device.matmul_flops_bf16 = 989e12 * kMatmulEff;
  c.device.vector_flops = 67e12 * kMatmulEff;
  c.device.memory_bandwidth = hbm_bytes_per_s * kHbmEff;
  c.device.memory_bytes = hbm_bytes;
  c.device.launch_s = 4e-6;
  c.device.host_link_bandwidth = 64e9 * kHbmEff;
  c.devices_per_node = 8;
  c.intra_node = {450e9 * kNvlinkEff, 3e-6};
  c.inter_node = {50e9 * kIbEff, 6e-6};
  c.overlap_collectives = true;
  c.source = "NVIDIA " + std::string(name == "h100x8" ? "H100" : "H200") +
             " SXM and DGX datasheets, derated to sustained rates";
  return c;
}

// A TPU-v4-like pod: 4096 chips on one 3-D inter-chip interconnect (ICI). Figures from Google
// Cloud's TPU v4 documentation: 275 TFLOPS bf16 per chip, 32 GiB HBM2 at 1200 GBps, 4096 chips
// per pod, all-reduce bandwidth 1.1 PB/s per pod. A mesh axis is taken to run along one torus
// dimension: 1.1 PB/s / 4096 chips / 3 dimensions, about 90 GB/s per chip and axis. Assumptions
// (not in the documentation): f32 matmuls at a quarter of the bf16 rate (several bf16 passes),
// the vector unit at 5% of the matrix peak, 2 us per ring step and per fused kernel, and between
// pods a data-center network of 6.25 GB/s per chip with 10 us steps.
Cluster tpu_v4_pod() {
  Cluster c;
  c.name = "tpuv4";
  c.device.matmul_flops_bf16 = 275e12 * kMatmulEff;
  c.device.matmul_flops_f32 = c.device.matmul_flops_bf16 / 4;
  c.device.vector_flops = 275e12 * 0.05;
  c.device.memory_bandwidth = 1200e9 * kHbmEff;
  c.device.memory_bytes = int64_t{32} << 30;
  c.device.launch_s = 2e-6;
  c.devices_per_node = 4096;
  c.intra_node = {1.1e15 / 4096 / 3 * kNvlinkEff, 2e-6};
  c.inter_node = {6.25e9 * kIbEff, 10e-6};
  c.overlap_collectives = true;
  c.source = "Google Cloud TPU v4 documentation (pod), derated to sustained rates";
  return c;
}

}  // namespace

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names = backend_platforms();
  for (const char* n : {"h100x8", "h200x8", "tpuv4"}) names.push_back(n);
  return names;
}

Cluster cluster_preset(const std::string& name) {
  if (has_backend(name)) return platform_cluster(name);
  if (name == "h100x8") return hopper_node("h100x8", 3.35e12, int64_t{80} * 1000 * 1000 * 1000);
  if (name == "h200x8") return hopper_node("h200x8", 4.8e12, int64_t{141} * 1000 * 1000 * 1000);
  if (name == "tpuv4") return tpu_v4_pod();
  std::string known;
  for (const auto& n : cluster_preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("[cluster] unknown cluster preset '" + name + "'; the presets are " + known +
              ", or give a path to a TOML file ending in .toml (see docs/auto-sharding.md)");
}

Cluster load_cluster(const std::string& name_or_path) {
  const std::string& s = name_or_path;
  if (s.size() > 5 && s.compare(s.size() - 5, 5, ".toml") == 0) return read_cluster_file(s);
  return cluster_preset(s);
}

// ---- TOML ---------------------------------------------------------------------------------

namespace {

struct TomlReader {
  std::string where;
  [[noreturn]] void fail(const std::string& msg) const { throw UserError("[cluster] " + where + ": " + msg); }

  void check_keys(const toml::table& t, const std::string& section, const std::vector<std::string>& known) const {
    for (const auto& [k, v] : t) {
      std::string key(k.str());
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
      fail("unknown key '" + (section.empty() ? key : section + "." + key) + "'; the keys of " +
           (section.empty() ? std::string("the top level") : "[" + section + "]") + " are " + list);
    }
  }

  // A positive (or non-negative) number; ints accepted.
  std::optional<double> number(const toml::table& t, const std::string& section, const std::string& key,
                               const std::string& example, bool allow_zero = false) const {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    std::string full = section.empty() ? key : section + "." + key;
    double v = 0;
    if (auto f = n->value_exact<double>()) v = *f;
    else if (auto i = n->value_exact<int64_t>()) v = static_cast<double>(*i);
    else fail(full + " must be a number, e.g. " + key + " = " + example);
    if (!(v > 0 || (allow_zero && v == 0)) || !std::isfinite(v))
      fail(full + " must be " + (allow_zero ? "zero or positive" : "positive") + ", got " + std::to_string(v) +
           "; e.g. " + key + " = " + example);
    return v;
  }
  double required(const toml::table& t, const std::string& section, const std::string& key,
                  const std::string& example) const {
    auto v = number(t, section, key, example);
    if (!v) fail(section + "." + key + " is missing; add it under [" + section + "], e.g. " + key + " = " + example);
    return *v;
  }
  const toml::table* table(const toml::table& t, const std::string& key) const {
    const toml::node* n = t.get(key);
    if (!n) return nullptr;
    if (!n->is_table()) fail(key + " must be a table: write it as a section [" + key + "]");
    return n->as_table();
  }
  Link link(const toml::table& t, const std::string& section) const {
    check_keys(t, section, {"bandwidth_bytes_per_s", "latency_s"});
    Link l;
    l.bandwidth_bytes_per_s = required(t, section, "bandwidth_bytes_per_s", "450e9");
    auto lat = number(t, section, "latency_s", "3e-6", true);
    if (!lat) fail(section + ".latency_s is missing; add it under [" + section + "], e.g. latency_s = 3e-6");
    l.latency_s = *lat;
    return l;
  }
  template <typename T>
  std::optional<T> exact(const toml::table& t, const std::string& key, const char* what, const char* example) const {
    const toml::node* n = t.get(key);
    if (!n) return std::nullopt;
    auto v = n->value_exact<T>();
    if (!v) fail(key + " must be " + what + ", e.g. " + key + " = " + example);
    return *v;
  }
};

}  // namespace

Cluster cluster_from_toml(const std::string& text, const std::string& where) {
  TomlReader r{where};
  toml::table root;
  check_toml_text(text, where);
  try {
    root = toml::parse(text, where);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << "not valid TOML at line " << e.source().begin.line << ", column " << e.source().begin.column << ": "
       << e.description();
    r.fail(os.str());
  }
  r.check_keys(root, "", {"name", "source", "devices_per_node", "devices_share_host",
                          "overlap_collectives", "device", "intra_node", "inter_node", "in_process", "axis"});
  Cluster c;
  c.name = r.exact<std::string>(root, "name", "a string", "\"my_cluster\"").value_or("custom");
  c.source = r.exact<std::string>(root, "source", "a string", "\"measured with nccl-tests\"").value_or(where);
  c.devices_per_node = r.exact<int64_t>(root, "devices_per_node", "an integer", "8").value_or(0);
  if (c.devices_per_node < 0) r.fail("devices_per_node must be 0 (one node) or positive, e.g. devices_per_node = 8");
  c.devices_share_host = r.exact<bool>(root, "devices_share_host", "true or false", "false").value_or(false);
  c.overlap_collectives = r.exact<bool>(root, "overlap_collectives", "true or false", "true").value_or(true);

  const toml::table* dev = r.table(root, "device");
  if (!dev) r.fail("the [device] section is missing; add [device] with matmul_flops_f32, memory_bandwidth and "
                   "memory_bytes (see docs/auto-sharding.md)");
  r.check_keys(*dev, "device", {"matmul_flops_f32", "matmul_flops_bf16", "vector_flops", "memory_bandwidth",
                                "memory_bytes", "launch_s", "host_link_bandwidth"});
  c.device.matmul_flops_f32 = r.required(*dev, "device", "matmul_flops_f32", "67e12");
  c.device.matmul_flops_bf16 = r.number(*dev, "device", "matmul_flops_bf16", "989e12").value_or(c.device.matmul_flops_f32);
  c.device.vector_flops = r.number(*dev, "device", "vector_flops", "67e12").value_or(c.device.matmul_flops_f32);
  c.device.memory_bandwidth = r.required(*dev, "device", "memory_bandwidth", "3.35e12");
  double mem = r.required(*dev, "device", "memory_bytes", "80e9");
  if (mem > 9.2e18) r.fail("device.memory_bytes is too large: " + std::to_string(mem));
  c.device.memory_bytes = static_cast<int64_t>(mem);
  c.device.launch_s = r.number(*dev, "device", "launch_s", "4e-6", true).value_or(0.0);
  c.device.host_link_bandwidth = r.number(*dev, "device", "host_link_bandwidth", "64e9", true).value_or(0.0);

  const toml::table* intra = r.table(root, "intra_node");
  if (!intra) r.fail("the [intra_node] section is missing; add it with bandwidth_bytes_per_s and latency_s");
  c.intra_node = r.link(*intra, "intra_node");
  if (const toml::table* inter = r.table(root, "inter_node")) c.inter_node = r.link(*inter, "inter_node");
  else if (c.devices_per_node > 0)
    r.fail("devices_per_node = " + std::to_string(c.devices_per_node) +
           " but the [inter_node] section is missing; add it with bandwidth_bytes_per_s and latency_s, or set "
           "devices_per_node = 0 for one node");
  else c.inter_node = c.intra_node;
  if (const toml::table* ip = r.table(root, "in_process")) {
    r.check_keys(*ip, "in_process", {"all_reduce", "all_gather", "reduce_scatter", "all_to_all"});
    c.in_process.all_reduce = r.required(*ip, "in_process", "all_reduce", "5e9");
    c.in_process.all_gather = r.required(*ip, "in_process", "all_gather", "4e9");
    c.in_process.reduce_scatter = r.required(*ip, "in_process", "reduce_scatter", "5e9");
    c.in_process.all_to_all = r.required(*ip, "in_process", "all_to_all", "4e9");
    if (!c.devices_share_host)
      r.fail("[in_process] describes virtual devices that share one host, but devices_share_host is false; set "
             "devices_share_host = true or remove [in_process]");
  }
  if (const toml::table* axes = r.table(root, "axis")) {
    for (const auto& [k, v] : *axes) {
      std::string name(k.str());
      if (!v.is_table()) r.fail("axis." + name + " must be a table: write it as a section [axis." + name + "]");
      c.axis_links[name] = r.link(*v.as_table(), "axis." + name);
    }
  }
  return c;
}

Cluster read_cluster_file(const std::string& path) {
  io::require_regular_file(path, "[cluster] ");
  std::ifstream in(path);
  if (!in) throw UserError("[cluster] cannot read the cluster file '" + path + "'; check the path");
  std::stringstream ss;
  ss << in.rdbuf();
  return cluster_from_toml(ss.str(), path);
}

// ---- Calibration --------------------------------------------------------------------------

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Seconds of the fastest call of fn: one warm-up call, then calls until `budget` seconds (at
// least 3). The fastest call is what the hardware sustains; slower ones were preempted by other
// work (a shared machine), which a mean would fold into the rate.
template <typename F>
double time_calls(F&& fn, double budget) {
  fn();
  auto t0 = std::chrono::steady_clock::now();
  int calls = 0;
  double best = 1e30;
  do {
    auto t = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, seconds_since(t));
    ++calls;
  } while (calls < 3 || seconds_since(t0) < budget);
  return best;
}

// FLOP/s of an n x n x n matmul through the platform's backend with the given compute dtype.
double matmul_rate(const std::string& platform, int64_t n, DType compute, double budget) {
  auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{matmul(in[0], in[1])}; },
                 {{DType::f32, {n, n}}, {DType::f32, {n, n}}});
  CompileOptions opt;
  opt.platform = platform;
  opt.compute_dtype = compute;
  auto exe = Executable::compile(*g, opt);
  std::vector<float> v(static_cast<size_t>(n * n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17) * 0.01f;
  const Placement at{0, MemoryKind::device, platform};
  std::vector<Array> in{Array::from_f32(v, {n, n}).to(at), Array::from_f32(v, {n, n}).to(at)};
  std::vector<Array> out{Array(DType::f32, {n, n}, at)};
  double s = time_calls([&] { exe->run_into(in, out); }, budget);
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s;
}

// Each kind of collective as the in-process communicator runs it over two virtual devices (the
// runtime calls it between kernels; it spreads the copies over the threads), on 2 MiB per device
// (a layer's weight) in buffers out of the cache; reductions read inputs just written, as
// gradients are. Payload bytes per second per device, the median call of 3 rounds over the buffers.
InProcessRates measure_in_process_collectives() {
  std::unique_ptr<Communicator> comm = make_inproc_communicator(2);
  const DeviceGroups pair{{0, 1}};
  constexpr int64_t kCount = int64_t{1} << 19;  // f32 elements of payload per device
  constexpr int kSets = 16;                     // 16 x 8 MiB of buffers: more than a last-level cache
  std::vector<std::vector<float>> mem(kSets * 4, std::vector<float>(static_cast<size_t>(kCount), 1.f));
  auto rate = [&](bool fresh_inputs, auto&& call) {
    std::vector<double> t;
    for (int round = 0; round < 3 * kSets; ++round) {
      float* b[4];
      for (int i = 0; i < 4; ++i) b[i] = mem[static_cast<size_t>(4 * (round % kSets) + i)].data();
      if (fresh_inputs) {
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < 2 * kCount; ++i) b[i / kCount][i % kCount] = static_cast<float>(i % 7);
      }
      auto t0 = std::chrono::steady_clock::now();
      call(b);
      t.push_back(seconds_since(t0));
    }
    std::nth_element(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2), t.end());
    return static_cast<double>(kCount) * 4.0 / t[t.size() / 2];
  };
  InProcessRates r;
  r.all_reduce = rate(true, [&](float** b) {
    comm->all_reduce({b[0], b[1]}, {b[2], b[3]}, kCount, DType::f32, ReduceOp::sum, pair);
  });
  r.all_gather = rate(false, [&](float** b) {
    comm->all_gather({b[0], b[1]}, {b[2], b[3]}, kCount / 2, DType::f32, pair);
  });
  r.reduce_scatter = rate(true, [&](float** b) {
    comm->reduce_scatter({b[0], b[1]}, {b[2], b[3]}, kCount, DType::f32, ReduceOp::sum, pair);
  });
  r.all_to_all = rate(false, [&](float** b) {
    comm->all_to_all({b[0], b[1]}, {b[2], b[3]}, kCount, DType::f32, pair);
  });
  return r;
}

std::string host_fingerprint(const std::string& platform) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::ostringstream os;
  os << host << ", " << std::thread::hardware_concurrency() << " cores, " << backend_for(platform).num_threads()
     << " threads";
  return os.str();
}

// The matmul rate at the largest of 128 and 512 that one call takes under 20 ms at (a slow
// backend, such as ref's plain loops, is measured on the smaller product).
double matmul_rate(const std::string& platform, DType compute, double budget) {
  const double small = matmul_rate(platform, 128, compute, 0.0);
  return 2.0 * 128 * 128 * 128 / small > 2.0 * 512 * 512 * 512 / 0.02 ? matmul_rate(platform, 512, compute, budget)
                                                                      : small;
}

}  // namespace

Cluster calibrate(const std::string& platform) {
  backend_for(platform);  // an unknown platform fails here, naming the registered ones
  const Placement at{0, MemoryKind::device, platform};
  Cluster c;
  c.name = platform;
  c.devices_per_node = 0;
  c.devices_share_host = true;
  c.overlap_collectives = false;  // in-process collectives are copies on the compute cores, at their start
  c.device.matmul_flops_f32 = matmul_rate(platform, DType::f32, 0.12);
  c.device.matmul_flops_bf16 = matmul_rate(platform, DType::bf16, 0.12);

  // Streaming bandwidth: read + written bytes per second of a 64 MiB copy by all threads (each a
  // slice), as the host's devices stream at once.
  const size_t bytes = size_t{64} << 20;
  std::vector<char> a(bytes, 1), b(bytes, 2);
  double copy_s = time_calls(
      [&] {
#pragma omp parallel
        {
          const size_t n = static_cast<size_t>(omp_get_num_threads()), t = static_cast<size_t>(omp_get_thread_num());
          const size_t lo = bytes / n * t, hi = t + 1 == n ? bytes : bytes / n * (t + 1);
          std::memcpy(b.data() + lo, a.data() + lo, hi - lo);
        }
        a[0] = b[1];
      },
      0.08);
  c.device.memory_bandwidth = 2.0 * static_cast<double>(bytes) / copy_s;

  // Elementwise arithmetic: a fused chain of transcendental and arithmetic ops over 32K floats
  // (in cache, so compute-bound), its FLOPs counted by the primitives' own cost entries.
  {
    const int64_t n = 1 << 15;
    auto g = trace(
        [](const std::vector<Tensor>& in) {
          Tensor x = in[0];
          for (int k = 0; k < 4; ++k) x = tanh(add(mul(exp(x), x), in[0]));
          return std::vector<Tensor>{x};
        },
        {{DType::f32, {n}}});
    double flops = 0;
    for (const Node& nd : g->nodes()) {
      std::vector<TensorType> ins, outs;
      for (int v : nd.inputs) ins.push_back(g->type(v));
      for (int v : nd.outputs) outs.push_back(g->type(v));
      flops += cost_of(*nd.prim, ins, outs, nd.attrs).flops;
    }
    CompileOptions opt;
    opt.platform = platform;
    auto exe = Executable::compile(*g, opt);
    std::vector<float> v(static_cast<size_t>(n));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 13) * 0.01f;
    std::vector<Array> in{Array::from_f32(v, {n}).to(at)};
    std::vector<Array> out{Array(DType::f32, {n}, at)};
    c.device.vector_flops = flops / time_calls([&] { exe->run_into(in, out); }, 0.04);
  }
  // Launch: one tiny kernel per run.
  {
    auto g = trace([](const std::vector<Tensor>& in) { return std::vector<Tensor>{add(in[0], in[1])}; },
                   {{DType::f32, {1}}, {DType::f32, {1}}});
    CompileOptions opt;
    opt.platform = platform;
    auto exe = Executable::compile(*g, opt);
    std::vector<Array> in{Array::from_f32({1.f}, {1}).to(at), Array::from_f32({2.f}, {1}).to(at)};
    std::vector<Array> out{Array(DType::f32, {1}, at)};
    c.device.launch_s = time_calls([&] { exe->run_into(in, out); }, 0.02) / std::max(1, exe->num_steps());
  }
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  c.device.memory_bytes = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;

  // The link between virtual devices: in-process copies. Bandwidth = bytes copied per second;
  // latency from what small collectives over two devices add to a sharded program as the runtime
  // runs it (the devices' threads meet at every collective): a chain of kLinks one-row
  // reductions, less the same program without them, per collective the partitioner emitted for
  // them (the in-process model charges n - 1 latencies per collective over n devices).
  c.intra_node.bandwidth_bytes_per_s = static_cast<double>(bytes) / copy_s;
  {
    constexpr int kLinks = 64;
    auto chain = [&](int k) {
      auto fn = [k](const std::vector<Tensor>&, const std::vector<Tensor>& a) {
        Tensor y = a[0];
        for (int i = 0; i < k; ++i) y = add(y, broadcast_to(sum(y, {0}, true), y.shape()));
        return std::vector<Tensor>{sum(y, {0})};
      };
      auto f = jit(fn, ShardingStrategy::DDP, {}, {}, {{DType::f32, {2, 16}}},
                   Mesh::create({{"data", 2}}, DeviceSet{platform, 2}));
      double steps = 0;  // collectives over the two devices
      for (const CollectiveRecord& r : f->executable().program().collectives) steps += !r.local_slice();
      std::vector<Array> args{Array::from_f32(std::vector<float>(32, 0.f), {2, 16})};
      return std::pair{time_calls([&] { (*f)({}, args); }, 0.03), steps};
    };
    const auto [with_s, with_steps] = chain(kLinks);
    const auto [without_s, without_steps] = chain(0);
    c.intra_node.latency_s = std::max(0.0, with_s - without_s) / std::max(1.0, with_steps - without_steps);
  }
  c.inter_node = c.intra_node;
  c.in_process = measure_in_process_collectives();
  c.source = "calibrated on " + host_fingerprint(platform);
  return c;
}

// A sanitized or unoptimized build measures a machine many times slower than a release build of
// the same code: each keeps its own calibration.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define PX_SANITIZED_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(PX_SANITIZED_BUILD)
constexpr const char* kBuildFlavour = "-sanitized";
#elif !defined(NDEBUG)
constexpr const char* kBuildFlavour = "-debug";
#else
constexpr const char* kBuildFlavour = "";
#endif

std::string cluster_cache_path(const std::string& platform) {
  const std::string cache = user_cache_dir();
  const std::filesystem::path base = cache.empty() ? std::filesystem::temp_directory_path() : std::filesystem::path(cache);
  // One file per thread count: processes run with other counts (an mpirun test with one thread
  // each) measure other rates, and must not overwrite each other's.
  return (base / "parallax" /
          (platform + "_cluster-" + std::to_string(backend_for(platform).num_threads()) + "threads" + kBuildFlavour +
           ".toml"))
      .string();
}

Cluster platform_cluster(const std::string& platform, bool recalibrate) {
  const std::string path = cluster_cache_path(platform);
  recalibrate = recalibrate || recalibrate_requested();
  const std::string fp = "calibrated on " + host_fingerprint(platform);
  if (!recalibrate && std::filesystem::exists(path)) {
    try {
      Cluster c = read_cluster_file(path);
      // Measured on another host or thread count, or before the in-process collectives were: measure again.
      if (c.source == fp && c.in_process.known()) return c;
    } catch (const Error&) {
      // an unreadable cache is measured again and overwritten
    }
  }
  Cluster c = calibrate(platform);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  std::string tmp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    out << "# This machine's devices of platform " << platform << ", measured by px::calibrate(\"" << platform
        << "\"). Delete this file, run with\n"
        << "# PX_RECALIBRATE=1 or bench/plan --recalibrate to measure again.\n"
        << c.to_toml();
  }
  std::filesystem::rename(tmp, path, ec);  // best effort: without a cache the next call measures again
  if (ec) std::filesystem::remove(tmp, ec);
  return c;
}

}  // namespace px
