// The per-device memory report of a planned program (what Executable::memory() returns and the
// planners read) and the memory-limit check, with the floor: the bytes that must be alive together
// in any order of the program.
#include <algorithm>
#include <array>
#include <map>
#include <sstream>

#include "ir/primitive.h"
#include "runtime/compile_passes.h"
#include "runtime/order.h"

namespace px {

std::string MemoryReport::to_string() const {
  std::ostringstream os;
  os << "peak " << peak_bytes << " bytes per device (inputs " << input_bytes << ", outputs " << output_bytes
     << ", arena " << arena_bytes << " of which " << arena_live_bytes << " live at the peak)\n";
  if (floor_bytes > 0)
    os << "floor " << floor_bytes << " bytes (the caller's arrays and what must be alive together in any order); "
       << "peak / floor " << peak_over_floor() << "\n";
  if (donated_bytes > 0) os << "donated: " << donated_bytes << " bytes of outputs written into their inputs\n";
  for (int c = 0; c < kNumMemoryCategories; ++c)
    os << "  " << memory_category_name(static_cast<MemoryCategory>(c)) << ": " << by_category[c]
       << " bytes at the peak (arena at most " << arena_max_by_category[c] << " at once)\n";
  if (host_peak_bytes() > 0 || transfer_bytes > 0)
    os << "pinned_host " << host_peak_bytes() << " bytes (inputs " << host_input_bytes << ", outputs "
       << host_output_bytes << ", arena " << host_arena_bytes << "); " << transfer_bytes
       << " bytes transferred between memory kinds per run\n";
  bool layers = false;
  for (const Use& u : largest) layers = layers || !u.layer.empty();
  if (layers) {
    os << "largest at the peak, by category and layer:\n";
    for (size_t i = 0; i < largest.size() && i < 8; ++i)
      os << "  " << memory_category_name(largest[i].category) << " "
         << (largest[i].layer.empty() ? std::string("(no layer)") : largest[i].layer) << ": " << largest[i].bytes
         << " bytes\n";
  }
  return os.str();
}

MemoryReport memory_report(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                           const LoweredCollectives& colls, const Donation& donation, const ArenaPlans& plans,
                           bool one_forward_pass) {
  const size_t nv = g.values().size();
  auto on_device = [&](int v) { return g.values()[v].kind == MemoryKind::device; };
  MemoryReport rep;
  rep.transfer_bytes = colls.transfer_bytes;
  // The caller's arrays by their category (a donated output lives in its input's array).
  auto counted_output = [&](size_t o) { return donation.output_donor[o] < 0; };
  for (int v : g.inputs())
    (on_device(v) ? rep.input_bytes : rep.host_input_bytes) += g.type(v).nbytes();
  for (size_t o = 0; o < g.outputs().size(); ++o) {
    const int v = g.outputs()[o];
    if (!counted_output(o))
      rep.donated_bytes += g.type(v).nbytes();
    else
      (on_device(v) ? rep.output_bytes : rep.host_output_bytes) += g.type(v).nbytes();
  }
  rep.arena_bytes = plans.device.peak_bytes;
  rep.host_arena_bytes = plans.host.peak_bytes;
  rep.arena_live_bytes = plans.device.peak_live_bytes;
  rep.peak_bytes = rep.input_bytes + rep.output_bytes + rep.arena_bytes;
  // By category, and by category and layer (collective scratch has no layer).
  std::map<std::pair<int, std::string>, int64_t> use;
  auto count = [&](MemoryCategory c, const std::string& l, int64_t bytes) {
    rep.by_category[static_cast<int>(c)] += bytes;
    use[{static_cast<int>(c), l}] += bytes;
  };
  for (int v : g.inputs())
    if (on_device(v)) count(g.values()[v].category, g.values()[v].layer, g.type(v).nbytes());
  for (size_t o = 0; o < g.outputs().size(); ++o)
    if (const int v = g.outputs()[o]; on_device(v) && counted_output(o))
      count(g.values()[v].category, g.values()[v].layer, g.type(v).nbytes());
  for (int b : plans.device.live_at_peak)
    count(buffers.category[b], b < static_cast<int>(nv) ? g.values()[b].layer : std::string(),
          aligned_size(buffers.bytes[b]));
  for (auto& [key, bytes] : use) rep.largest.push_back({static_cast<MemoryCategory>(key.first), key.second, bytes});
  std::stable_sort(rep.largest.begin(), rep.largest.end(),
                   [](const MemoryReport::Use& a, const MemoryReport::Use& b) { return a.bytes > b.bytes; });
  // Sweep the buffers' lifetimes for the most bytes of each category live at once.
  std::vector<std::array<int64_t, kNumMemoryCategories>> delta(units.size() + 1);
  for (size_t b = 0; b < buffers.bytes.size(); ++b) {
    if (plans.device.offset[b] < 0) continue;
    const int c = static_cast<int>(buffers.category[b]);
    delta[plans.device.first_step[b]][c] += aligned_size(buffers.bytes[b]);
    delta[plans.device.last_step[b] + 1][c] -= aligned_size(buffers.bytes[b]);
  }
  std::array<int64_t, kNumMemoryCategories> cur{};
  for (const auto& d : delta)
    for (int c = 0; c < kNumMemoryCategories; ++c) {
      cur[c] += d[c];
      rep.arena_max_by_category[c] = std::max(rep.arena_max_by_category[c], cur[c]);
    }
  // The floor: the caller's arrays and the arena bytes that must be alive together in any order.
  // A training step's backward pass and update run after its forward pass (what remat saves is
  // alive across), whatever else the dependences would allow. Copies and collectives are bound by
  // their operands only. A step of several microbatches has several forward passes: no phases.
  std::vector<char> phase;
  if (const std::vector<char> fwd = one_forward_pass ? forward_nodes(g) : std::vector<char>();
      !fwd.empty()) {
    phase.assign(units.size(), 0);
    for (size_t u = 0; u < units.size(); ++u) {
      if (colls.of_unit[u] >= 0) {
        phase[u] = 2;
        continue;
      }
      for (int node : units[u].nodes) phase[u] = phase[u] || !fwd[node];
    }
  }
  auto [must, unit] = must_live_bytes(buffers.bytes, plans.steps, plans.external_to_device, plans.live_to_end, phase);
  if (must < 0) must = plans.device.peak_live_bytes;  // too many units to analyse: what the plan holds
  rep.floor_bytes = rep.input_bytes + rep.output_bytes + must;
  rep.floor_live_unit = unit;
  return rep;
}

void check_limits(const MemoryReport& rep, const CompileOptions& opt, const Graph& g, const ProgramBuffers& buffers,
                  const ArenaPlans& plans) {
  if (opt.host_memory_limit_bytes > 0 && rep.host_peak_bytes() > opt.host_memory_limit_bytes)
    throw UserError("[compile] the program needs " + std::to_string(rep.host_peak_bytes()) +
                    " bytes of pinned_host memory per device, over the limit of " +
                    std::to_string(opt.host_memory_limit_bytes) + " bytes:\n" + rep.to_string() +
                    "Offload less (OffloadOptions), raise the limit, or shard the program over more devices.");
  if (opt.memory_limit_bytes <= 0 || rep.peak_bytes <= opt.memory_limit_bytes) return;
  const size_t nv = g.values().size();
  std::ostringstream os;
  os << "[compile] the program needs " << rep.peak_bytes << " bytes per device, over the limit of "
     << opt.memory_limit_bytes << " bytes:\n"
     << rep.to_string() << "Largest buffers live at the peak:\n";
  std::vector<int> big = plans.device.live_at_peak;
  std::sort(big.begin(), big.end(), [&](int a, int b) { return buffers.bytes[a] > buffers.bytes[b]; });
  for (size_t i = 0; i < big.size() && i < 8; ++i) {
    const int b = big[i];
    if (b < static_cast<int>(nv)) {
      const int p = g.values()[b].producer;
      os << "  %" << b << " " << type_str(g.type(b)) << " " << buffers.bytes[b] << " bytes from "
         << (p >= 0 ? g.nodes()[p].prim->name : std::string("input"))
         << (g.values()[b].layer.empty() ? std::string() : " in " + g.values()[b].layer) << "\n";
    } else if (const auto u = std::find(buffers.kernel_scratch.begin(), buffers.kernel_scratch.end(), b);
               u != buffers.kernel_scratch.end()) {
      os << "  scratch of unit " << (u - buffers.kernel_scratch.begin()) << " " << buffers.bytes[b] << " bytes\n";
    } else {
      os << "  collective scratch " << buffers.bytes[b] << " bytes\n";
    }
  }
  std::vector<int> outs = g.outputs();
  std::sort(outs.begin(), outs.end(), [&](int a, int b) { return g.type(a).nbytes() > g.type(b).nbytes(); });
  for (size_t i = 0; i < outs.size() && i < 5; ++i) {
    const size_t pos = std::find(g.outputs().begin(), g.outputs().end(), outs[i]) - g.outputs().begin();
    os << "  output " << pos << ": %" << outs[i] << " " << type_str(g.type(outs[i])) << " "
       << g.type(outs[i]).nbytes() << " bytes\n";
  }
  os << "Raise the limit, shrink the batch, rematerialize activations (TrainStepOptions::remat) or shard the "
        "program over more devices.";
  throw UserError(os.str());
}

}  // namespace px
