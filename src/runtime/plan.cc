#include "runtime/plan.h"

#include "ir/primitive.h"

#include <algorithm>
#include <map>
#include <sstream>

namespace px {

namespace {
constexpr int64_t kAlign = 64;
int64_t aligned(int64_t n) { return (std::max<int64_t>(n, 1) + kAlign - 1) / kAlign * kAlign; }
}  // namespace

BufferPlan plan_buffers(const Graph& g, const std::vector<PlanStep>& steps, const std::vector<char>& external,
                        const std::vector<int>& outputs) {
  size_t nv = g.values().size();
  BufferPlan plan;
  plan.offset.assign(nv, -1);
  std::vector<int> last_use(nv, -1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int v : steps[s].in) last_use[v] = static_cast<int>(s);
  for (int v : outputs) last_use[v] = static_cast<int>(steps.size());

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
    for (int v : steps[s].out) {
      if (external[v] || plan.offset[v] >= 0) continue;
      int64_t size = aligned(g.type(v).nbytes());
      plan.offset[v] = allocate(size);
      live_bytes += size;
      live.push_back(v);
    }
    if (top > plan.peak_bytes) {
      plan.peak_bytes = top;
      plan.live_at_peak = live;
    }
    // Free what this step read for the last time, and outputs nobody reads.
    std::vector<int> dead;
    for (int v : live)
      if (last_use[v] <= static_cast<int>(s)) dead.push_back(v);
    for (int v : dead) {
      release(plan.offset[v], aligned(g.type(v).nbytes()));
      live_bytes -= aligned(g.type(v).nbytes());
      live.erase(std::find(live.begin(), live.end(), v));
    }
  }
  return plan;
}

std::string BufferPlan::report(const Graph& g) const {
  std::vector<int> vs = live_at_peak;
  std::sort(vs.begin(), vs.end(), [&](int a, int b) { return g.type(a).nbytes() > g.type(b).nbytes(); });
  std::ostringstream os;
  for (size_t i = 0; i < vs.size() && i < 10; ++i) {
    int v = vs[i];
    int p = g.values()[v].producer;
    os << "  %" << v << " " << type_str(g.type(v)) << " " << g.type(v).nbytes() << " bytes from "
       << (p >= 0 ? g.nodes()[p].prim->name : std::string("input")) << "\n";
  }
  return os.str();
}

}  // namespace px
