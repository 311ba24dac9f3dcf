// The cost model: a partitioned program planned as compile would plan it (without allocating),
// its kernels timed against the device's roofline, its collectives by the alpha-beta model over
// the links of their mesh axes, and the schedule played with collectives beside compute.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <sstream>

#include "ir/primitive.h"
#include "parallax/auto.h"
#include "runtime/program.h"
#include "sharding/groups.h"
#include "sharding/prims.h"
#include "sharding/recipes/step.h"

namespace px {

int64_t collective_wire_bytes(CollectiveKind k, int64_t n, int64_t payload) {
  if (n < 1) throw Error("[cost] a collective group needs at least one device, got " + std::to_string(n));
  switch (k) {
    case CollectiveKind::all_reduce:
      return payload * 2 * (n - 1) / n;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
      return payload * (n - 1) / n;
    case CollectiveKind::permute:
    case CollectiveKind::broadcast:
      return payload;
  }
  return 0;
}

double collective_seconds(CollectiveKind k, int64_t n, int64_t payload, const Link& link) {
  if (n <= 1 && k != CollectiveKind::permute) return 0;
  if (link.bandwidth_bytes_per_s <= 0)
    throw Error("[cost] a link with bandwidth " + std::to_string(link.bandwidth_bytes_per_s) +
                " bytes/s; give every mesh axis a positive bandwidth (Cluster::apply)");
  double steps = 1;
  switch (k) {
    case CollectiveKind::all_reduce:
      steps = 2.0 * static_cast<double>(n - 1);
      break;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all:
      steps = static_cast<double>(n - 1);
      break;
    case CollectiveKind::permute:
    case CollectiveKind::broadcast:
      steps = 1;
      break;
  }
  double ring = steps * link.latency_s +
                static_cast<double>(collective_wire_bytes(k, n, payload)) / link.bandwidth_bytes_per_s;
  if (k != CollectiveKind::all_reduce) return ring;
  // A small all-reduce over many devices runs as a (double binary) tree: a reduce and a broadcast
  // of ceil(log2 n) latency steps each, the payload pipelined through both (what NCCL picks when
  // the ring's 2(n-1) latency steps cost more).
  double levels = std::ceil(std::log2(static_cast<double>(n)));
  double tree = 2.0 * levels * link.latency_s + 2.0 * static_cast<double>(payload) / link.bandwidth_bytes_per_s;
  return std::min(ring, tree);
}

double in_process_collective_seconds(CollectiveKind k, int64_t n, int64_t devices, int64_t payload,
                                     const Link& link, const InProcessRates& rates) {
  if (n <= 1 && k != CollectiveKind::permute) return 0;
  if (!rates.known()) throw Error("[cost] in-process collective rates unknown; calibrate (px::calibrate(platform))");
  const double nn = static_cast<double>(n), p = static_cast<double>(payload);
  const double share = static_cast<double>(std::max<int64_t>(devices, 2)) / 2.0;  // rates are per device of two
  double rate = rates.all_to_all, traffic = 1, steps = nn - 1;
  switch (k) {
    case CollectiveKind::all_reduce:  // one pass over the group's buffers, not a ring's two
      rate = rates.all_reduce;
      break;
    case CollectiveKind::all_gather:
      rate = rates.all_gather;
      break;
    case CollectiveKind::reduce_scatter:
      rate = rates.reduce_scatter;
      traffic = (nn + 2) / (2 * nn);
      break;
    case CollectiveKind::all_to_all:
      break;
    case CollectiveKind::permute:
    case CollectiveKind::broadcast:
      steps = 1;
      break;
  }
  return steps * link.latency_s + p * traffic * share / rate;
}

std::string StepCost::to_string() const {
  std::ostringstream os;
  os << "step " << step_s * 1e3 << " ms (compute " << compute_s * 1e3 << " ms, collectives " << comm_s * 1e3
     << " ms of which " << exposed_comm_s() * 1e3 << " ms exposed); " << kernels << " kernels, " << flops / 1e9
     << " GFLOP per device\n";
  for (int k = 0; k < kNumCollectiveKinds; ++k) {
    const Comm& c = collectives[k];
    if (!c.calls) continue;
    os << "  " << collective_name(static_cast<CollectiveKind>(k)) << ": " << c.calls << " calls, payload "
       << c.payload_bytes << " bytes, wire " << c.wire_bytes << " bytes, " << c.seconds * 1e3 << " ms\n";
  }
  os << "  memory: peak " << memory.peak_bytes << " of " << memory_capacity << " bytes per device"
     << (fits() ? "" : " (does not fit)") << "\n";
  return os.str();
}

namespace {

// The slowest link among the axes a collective runs over (a ring over them crosses each).
Link group_link(const Mesh& mesh, const std::vector<std::string>& axes) {
  Link l{0, 0};
  bool first = true;
  for (const auto& a : axes) {
    const Link& x = mesh.axes()[mesh.require_axis(a, "cost")].link;
    l.bandwidth_bytes_per_s = first ? x.bandwidth_bytes_per_s : std::min(l.bandwidth_bytes_per_s, x.bandwidth_bytes_per_s);
    l.latency_s = std::max(l.latency_s, x.latency_s);
    first = false;
  }
  if (first) return Link{};
  return l;
}

// One compute unit on the device's roofline.
double unit_seconds(const Graph& g, const Unit& u, const DeviceSpec& d, StepCost& out) {
  if (u.kind == Unit::Kind::view) return 0;
  double flops = 0, matmul = 0, bytes = 0;
  DType operands = DType::f32;
  for (int id : u.nodes) {
    const Node& n = g.nodes()[id];
    std::vector<TensorType> in, res;
    for (int v : n.inputs) in.push_back(g.type(v));
    for (int v : n.outputs) res.push_back(g.type(v));
    Cost c = cost_of(*n.prim, in, res, n.attrs);
    flops += c.flops;
    if (c.matmul_flops > 0) {
      matmul += c.matmul_flops;
      operands = in.empty() ? DType::f32 : in[0].dtype;  // a matmul is never fused with another
    }
    if (u.kind == Unit::Kind::kernel) bytes += c.bytes_read + c.bytes_written;
  }
  if (u.kind == Unit::Kind::fused) {
    // A fused group touches memory only for what it reads from outside and what it writes out.
    for (int v : u.in_values) bytes += static_cast<double>(g.type(v).nbytes());
    for (int v : u.out_values) bytes += static_cast<double>(g.type(v).nbytes());
  }
  out.flops += flops;
  out.matmul_flops += matmul;
  out.memory_bytes_moved += bytes;
  out.kernels += 1;
  return d.kernel_seconds(flops, matmul, operands, bytes);
}

void check_device(const DeviceSpec& d, const std::string& cluster) {
  auto bad = [&](const char* what, double v) {
    throw Error("[cost] cluster '" + cluster + "' has device." + what + " = " + std::to_string(v) +
                "; give it a positive value (see docs/auto-sharding.md)");
  };
  if (!(d.matmul_flops_f32 > 0)) bad("matmul_flops_f32", d.matmul_flops_f32);
  if (!(d.matmul_flops_bf16 > 0)) bad("matmul_flops_bf16", d.matmul_flops_bf16);
  if (!(d.vector_flops > 0)) bad("vector_flops", d.vector_flops);
  if (!(d.memory_bandwidth > 0)) bad("memory_bandwidth", d.memory_bandwidth);
}

}  // namespace

StepCost cost_program(const SpmdProgram& program, const Cluster& cluster, const CompileOptions& copt) {
  ensure_sharding_registered();
  const Mesh& mesh = program.mesh;
  const DeviceSpec dev = cluster.device_on(mesh);
  check_device(dev, cluster.name);
  CompileOptions opt = copt;
  opt.platform = mesh.platform();
  if (opt.output_donors.empty()) opt.output_donors = program.output_donors;  // a training step's state
  opt.memory_limit_bytes = 0;  // the cost reports whether it fits; it does not refuse
  PlannedProgram plan = plan_program(*program.local, opt, collective_groups(mesh));
  const Graph& g = *plan.graph;

  StepCost out;
  out.memory = plan.report;
  out.memory_capacity = dev.memory_bytes;

  // Every collective's kind, bytes (as the communicator counts them per device) and time.
  const int64_t D = mesh.size();
  std::vector<double> coll_s(plan.collectives.size(), 0);
  std::vector<int> node_of(plan.collectives.size(), -1);
  for (size_t u = 0; u < plan.units.size(); ++u)
    if (plan.collective_of_unit[u] >= 0) node_of[plan.collective_of_unit[u]] = plan.units[u].nodes[0];
  // Virtual devices with measured in-process collectives: those; else the ring over the links.
  const bool in_process = cluster.devices_share_host && cluster.in_process.known();
  auto seconds = [&](CollectiveKind k, int64_t n, int64_t payload, const Link& link) {
    return in_process ? in_process_collective_seconds(k, n, D, payload, link, cluster.in_process)
                      : collective_seconds(k, n, payload, link);
  };
  for (size_t c = 0; c < plan.collectives.size(); ++c) {
    const CollectiveOp& op = plan.collectives[c];
    const Node& n = g.nodes()[node_of[c]];
    if (op.transfer) {  // offload: a copy between device and pinned host memory
      const double bw = dev.host_link_bandwidth > 0 ? dev.host_link_bandwidth : dev.memory_bandwidth;
      coll_s[c] = static_cast<double>(numel(op.in_shape) * dtype_size(op.dtype)) / bw;
      out.transfer_s += coll_s[c];
      continue;
    }
    const CollectiveKind k = op.kind;
    const int64_t es = dtype_size(op.dtype);
    const int64_t count = numel(op.in_shape);
    StepCost::Comm& e = out.collectives[static_cast<int>(k)];
    int64_t payload = k == CollectiveKind::all_gather ? op.n * count * es : count * es;
    if (k == CollectiveKind::permute) {
      // Sources send: the device that sends the most sets the pace.
      std::vector<int64_t> sends(static_cast<size_t>(D), 0);
      for (auto [src, dst] : op.groups.pairs)
        if (src != dst) ++sends[src];
      int64_t most = *std::max_element(sends.begin(), sends.end());
      e.calls += most;
      e.payload_bytes += most * payload;
      e.wire_bytes += most * payload;
      coll_s[c] = static_cast<double>(most) * seconds(k, 2, payload, group_link(mesh, split_axes(n.attrs.s("axes"))));
    } else {
      e.calls += 1;
      e.payload_bytes += payload;
      e.wire_bytes += collective_wire_bytes(k, op.n, payload);
      coll_s[c] = seconds(k, op.n, payload, group_link(mesh, split_axes(n.attrs.s("axes"))));
    }
    // A gather or scatter over a dim that is not leading packs its blocks (runtime/collectives.cc):
    // a copy through the device's memory beside the exchange.
    coll_s[c] += 2.0 * static_cast<double>((op.scratch_in + op.scratch_out) * es) / dev.memory_bandwidth;
    e.seconds += coll_s[c];
    out.comm_s += coll_s[c];
  }

  // The schedule played: compute in order; a collective runs from its start (on its own engine
  // when the cluster overlaps them, one at a time) and compute waits for it at its wait unit.
  double t = 0, comm_free = 0, copy_free = 0;
  std::vector<double> done(plan.collectives.size(), 0);
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const Unit& unit = plan.units[u];
    const int c = plan.collective_of_unit[u];
    if (c < 0) {
      double s = unit_seconds(g, unit, dev, out);
      out.compute_s += s;
      t += s;
    } else if (unit.kind == Unit::Kind::collective_start && plan.collectives[c].transfer) {
      done[c] = copy_free = std::max(t, copy_free) + coll_s[c];  // the copy engine, one copy at a time
    } else if (unit.kind == Unit::Kind::collective_start) {
      if (cluster.overlap_collectives) {
        double start = std::max(t, comm_free);
        done[c] = comm_free = start + coll_s[c];
      } else {
        t += coll_s[c];
        done[c] = t;
      }
    } else {
      t = std::max(t, done[c]);
    }
  }
  out.step_s = std::max({t, comm_free, copy_free});
  return out;
}


}  // namespace px
