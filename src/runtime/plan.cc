#include "runtime/plan.h"

#include <algorithm>
#include <iterator>
#include <map>

#include "runtime/compile_passes.h"

namespace px {

namespace {

// Offsets in an arena that grows: best fit over a coalesced free list, else the top.
struct FreeList {
  std::map<int64_t, int64_t> blocks;  // offset -> size, coalesced
  int64_t top = 0;

  void release(int64_t off, int64_t size) {
    auto it = blocks.emplace(off, size).first;
    auto next = std::next(it);
    if (next != blocks.end() && it->first + it->second == next->first) {
      it->second += next->second;
      blocks.erase(next);
    }
    if (it != blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        blocks.erase(it);
      }
    }
  }

  // Best fit among the free blocks, else grow the top (merging a free block that ends at it).
  int64_t allocate(int64_t size) {
    auto best = blocks.end();
    for (auto it = blocks.begin(); it != blocks.end(); ++it)
      if (it->second >= size && (best == blocks.end() || it->second < best->second)) best = it;
    if (best != blocks.end()) {
      int64_t off = best->first, rest = best->second - size;
      blocks.erase(best);
      if (rest > 0) blocks.emplace(off + size, rest);
      return off;
    }
    if (!blocks.empty()) {
      auto last = std::prev(blocks.end());
      if (last->first + last->second == top) {
        int64_t off = last->first;
        blocks.erase(last);
        top = off + size;
        return off;
      }
    }
    int64_t off = top;
    top += size;
    return off;
  }
};

// The first placement, in step order: each buffer allocated when first written and released
// after its last reader; records every buffer's lifetime and what is live at the peak.
void place_in_step_order(const std::vector<int64_t>& sizes, const std::vector<PlanStep>& steps,
                         const std::vector<char>& external, const std::vector<int>& last_use, BufferPlan& plan) {
  FreeList arena;
  int64_t live_bytes = 0;
  std::vector<int> live;
  for (size_t s = 0; s < steps.size(); ++s) {
    for (int b : steps[s].out) {
      if (external[b] || plan.offset[b] >= 0) continue;
      int64_t size = aligned_size(sizes[b]);
      plan.offset[b] = arena.allocate(size);
      plan.first_step[b] = static_cast<int>(s);
      live_bytes += size;
      live.push_back(b);
    }
    plan.peak_bytes = std::max(plan.peak_bytes, arena.top);
    if (live_bytes > plan.peak_live_bytes) {
      plan.peak_live_bytes = live_bytes;
      plan.peak_step = static_cast<int>(s);
      plan.live_at_peak = live;
    }
    // Free what this step read for the last time, and results nobody reads.
    std::vector<int> dead;
    for (int b : live)
      if (last_use[b] <= static_cast<int>(s)) dead.push_back(b);
    for (int b : dead) {
      plan.last_step[b] = static_cast<int>(s);
      arena.release(plan.offset[b], aligned_size(sizes[b]));
      live_bytes -= aligned_size(sizes[b]);
      live.erase(std::find(live.begin(), live.end(), b));
    }
  }
  for (int b : live) plan.last_step[b] = static_cast<int>(steps.size()) - 1;
}

// A second placement, with every lifetime known (greedy by size, like XLA's heap simulator): the
// largest buffers first, each in the smallest gap that fits between the placed buffers whose
// lifetimes overlap its own, else above them. Placing in step order fragments where long-lived
// buffers are allocated among short-lived ones (a 16 MiB gradient at the end of the backward
// pass finds no hole that large); the arena keeps the smaller of the two plans. The placement
// compares every pair of buffers: programs of more than kMaxPlaced arena buffers keep the first.
void place_by_lifetime(const std::vector<int64_t>& sizes, BufferPlan& plan) {
  constexpr size_t kMaxPlaced = 20000;
  const size_t nb = sizes.size();
  std::vector<int> order;
  for (size_t b = 0; b < nb; ++b)
    if (plan.offset[b] >= 0) order.push_back(static_cast<int>(b));
  if (order.size() > kMaxPlaced) return;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const int64_t sa = aligned_size(sizes[a]), sb = aligned_size(sizes[b]);
    return sa != sb ? sa > sb : plan.first_step[a] < plan.first_step[b];
  });
  std::vector<int64_t> offset(nb, -1);
  std::vector<int> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;  // [offset, end) of the placed buffers alive with b
  int64_t top = 0;
  for (int b : order) {
    busy.clear();
    for (int p : placed)
      if (plan.first_step[p] <= plan.last_step[b] && plan.first_step[b] <= plan.last_step[p])
        busy.emplace_back(offset[p], offset[p] + aligned_size(sizes[p]));
    std::sort(busy.begin(), busy.end());
    const int64_t size = aligned_size(sizes[b]);
    int64_t at = -1, best_gap = 0, end = 0;
    for (const auto& [o, e] : busy) {
      if (o - end >= size && (at < 0 || o - end < best_gap)) {
        at = end;
        best_gap = o - end;
      }
      end = std::max(end, e);
    }
    offset[b] = at >= 0 ? at : end;
    top = std::max(top, offset[b] + size);
    placed.push_back(b);
  }
  if (top < plan.peak_bytes) {
    plan.offset = std::move(offset);
    plan.peak_bytes = top;
  }
}

}  // namespace

BufferPlan plan_buffers(const std::vector<int64_t>& sizes, const std::vector<PlanStep>& steps,
                        const std::vector<char>& external, const std::vector<int>& live_to_end) {
  const size_t nb = sizes.size();
  BufferPlan plan;
  plan.offset.assign(nb, -1);
  plan.first_step.assign(nb, -1);
  plan.last_step.assign(nb, -1);
  std::vector<int> last_use(nb, -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int b : steps[s].in) last_use[b] = static_cast<int>(s);
  for (int b : live_to_end) last_use[b] = static_cast<int>(steps.size());
  place_in_step_order(sizes, steps, external, last_use, plan);
  place_by_lifetime(sizes, plan);
  return plan;
}

std::pair<int64_t, int> must_live_bytes(const std::vector<int64_t>& sizes, const std::vector<PlanStep>& steps,
                                        const std::vector<char>& external, const std::vector<int>& live_to_end,
                                        const std::vector<char>& phase, size_t max_steps) {
  const size_t n = steps.size(), nb = sizes.size();
  if (n > max_steps) return {-1, -1};
  const size_t words = (n + 63) / 64;
  // anc[s]: s and the steps it depends on; desc[s]: s and the steps that depend on it.
  std::vector<uint64_t> anc(n * words, 0), desc(n * words, 0);
  std::vector<int> writer(nb, -1);
  std::vector<std::vector<int>> readers(nb);
  std::vector<std::vector<int>> preds(n);
  for (size_t s = 0; s < n; ++s) {
    for (int b : steps[s].in) {
      readers[b].push_back(static_cast<int>(s));
      if (writer[b] >= 0 && writer[b] != static_cast<int>(s)) preds[s].push_back(writer[b]);
    }
    for (int b : steps[s].out)
      if (writer[b] < 0) writer[b] = static_cast<int>(s);
  }
  // The two phases: every step of the second depends on every step of the first.
  const bool phased = phase.size() == n;
  std::vector<uint64_t> first(words, 0), second(words, 0);
  for (size_t s = 0; phased && s < n; ++s)
    if (phase[s] < 2) (phase[s] ? second : first)[s / 64] |= uint64_t{1} << (s % 64);
  for (size_t s = 0; s < n; ++s) {
    uint64_t* a = &anc[s * words];
    if (phased && phase[s] == 1)
      for (size_t w = 0; w < words; ++w) a[w] |= first[w];
    a[s / 64] |= uint64_t{1} << (s % 64);
    for (int p : preds[s])
      for (size_t w = 0; w <= static_cast<size_t>(p) / 64; ++w) a[w] |= anc[p * words + w];
  }
  for (size_t s = n; s-- > 0;) {
    desc[s * words + s / 64] |= uint64_t{1} << (s % 64);
    if (phased && phase[s] == 0)
      for (size_t w = 0; w < words; ++w) desc[s * words + w] |= second[w];
    for (int p : preds[s])
      for (size_t w = s / 64; w < words; ++w) desc[p * words + w] |= desc[s * words + w];
  }
  std::vector<char> to_end(nb, 0);
  for (int b : live_to_end) to_end[b] = 1;
  std::vector<int64_t> at(n, 0);
  std::vector<uint64_t> reach(words);
  bool any = false;
  for (size_t b = 0; b < nb; ++b) {
    if (external[b] || writer[b] < 0) continue;
    any = true;
    const int64_t size = aligned_size(sizes[b]);
    const uint64_t* d = &desc[static_cast<size_t>(writer[b]) * words];
    if (to_end[b]) {
      std::copy(d, d + words, reach.begin());
    } else {
      std::fill(reach.begin(), reach.end(), 0);
      for (int r : readers[b])
        for (size_t w = 0; w < words; ++w) reach[w] |= anc[static_cast<size_t>(r) * words + w];
      for (size_t w = 0; w < words; ++w) reach[w] &= d[w];
      // A buffer nobody reads is alive while its writer runs.
      reach[writer[b] / 64] |= uint64_t{1} << (writer[b] % 64);
    }
    for (size_t w = 0; w < words; ++w)
      for (uint64_t m = reach[w]; m; m &= m - 1) at[w * 64 + static_cast<size_t>(__builtin_ctzll(m))] += size;
  }
  if (!any) return {0, -1};
  size_t best = 0;
  for (size_t s = 1; s < n; ++s)
    if (at[s] > at[best]) best = s;
  return {at[best], static_cast<int>(best)};
}

}  // namespace px

namespace px {

// The program's arenas: a unit reads its operands' storage roots and writes its results (a view
// writes nothing); a collective's scratch is written at its start and read at its wait, so it is
// live between them, as are its operand and result; a kernel's scratch is written by its unit and
// read by none, so it is live only while the unit runs. Each memory kind's plan sees the other kind's
// buffers as external; returned values stay live to the end.
ArenaPlans plan_arenas(const Graph& g, const std::vector<Unit>& units, const ProgramBuffers& buffers,
                       const LoweredCollectives& colls, const std::vector<char>& external) {
  const size_t nv = g.values().size();
  const std::vector<int>& root = buffers.root;
  ArenaPlans a;
  for (size_t u = 0; u < units.size(); ++u) {
    const Unit& unit = units[u];
    PlanStep ps;
    for (int v : unit.in_values) ps.in.push_back(root[v]);
    if (unit.kind != Unit::Kind::view) ps.out = unit.out_values;
    if (const int c = colls.of_unit[u]; c >= 0) {
      std::vector<int>& side = unit.kind == Unit::Kind::collective_start ? ps.out : ps.in;
      side.insert(side.end(), colls.scratch_of[c].begin(), colls.scratch_of[c].end());
    }
    if (const int b = buffers.kernel_scratch.empty() ? -1 : buffers.kernel_scratch[u]; b >= 0) ps.out.push_back(b);
    a.steps.push_back(std::move(ps));
  }
  for (int v : g.outputs()) a.live_to_end.push_back(root[v]);
  bool any_host = false;
  a.external_to_device = external;
  std::vector<char> external_to_host = external;
  for (size_t b = 0; b < buffers.bytes.size(); ++b) {
    const bool host = buffers.kind[b < nv ? root[b] : b] == MemoryKind::pinned_host;
    (host ? a.external_to_device : external_to_host)[b] = 1;
    any_host = any_host || (host && !external[b]);
  }
  a.device = plan_buffers(buffers.bytes, a.steps, a.external_to_device, a.live_to_end);
  if (any_host)
    a.host = plan_buffers(buffers.bytes, a.steps, external_to_host, a.live_to_end);
  else
    a.host.offset.assign(buffers.bytes.size(), -1);
  return a;
}

}  // namespace px
