#include "runtime/plan.h"

#include <algorithm>
#include <iterator>
#include <map>

namespace px {

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

  std::map<int64_t, int64_t> free_blocks;  // offset -> size, coalesced
  int64_t top = 0, live_bytes = 0;
  std::vector<int> live;
  auto release = [&](int64_t off, int64_t size) {
    auto it = free_blocks.emplace(off, size).first;
    auto next = std::next(it);
    if (next != free_blocks.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_blocks.erase(next);
    }
    if (it != free_blocks.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_blocks.erase(it);
      }
    }
  };
  auto allocate = [&](int64_t size) {
    // Best fit among free blocks, else grow the top (merging a free block that ends at top).
    auto best = free_blocks.end();
    for (auto it = free_blocks.begin(); it != free_blocks.end(); ++it)
      if (it->second >= size && (best == free_blocks.end() || it->second < best->second)) best = it;
    if (best != free_blocks.end()) {
      int64_t off = best->first, rest = best->second - size;
      free_blocks.erase(best);
      if (rest > 0) free_blocks.emplace(off + size, rest);
      return off;
    }
    if (!free_blocks.empty()) {
      auto last = std::prev(free_blocks.end());
      if (last->first + last->second == top) {
        int64_t off = last->first;
        free_blocks.erase(last);
        top = off + size;
        return off;
      }
    }
    int64_t off = top;
    top += size;
    return off;
  };

  for (size_t s = 0; s < steps.size(); ++s) {
    for (int b : steps[s].out) {
      if (external[b] || plan.offset[b] >= 0) continue;
      int64_t size = aligned_size(sizes[b]);
      plan.offset[b] = allocate(size);
      plan.first_step[b] = static_cast<int>(s);
      live_bytes += size;
      live.push_back(b);
    }
    plan.peak_bytes = std::max(plan.peak_bytes, top);
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
      release(plan.offset[b], aligned_size(sizes[b]));
      live_bytes -= aligned_size(sizes[b]);
      live.erase(std::find(live.begin(), live.end(), b));
    }
  }
  for (int b : live) plan.last_step[b] = static_cast<int>(steps.size()) - 1;
  return plan;
}

}  // namespace px
