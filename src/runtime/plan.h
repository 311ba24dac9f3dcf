// Liveness-based buffer plan: every value that crosses a step boundary gets an offset in one
// arena; buffers whose last reader has run are reused. The peak is known before running.
#pragma once

#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px {

struct PlanStep {
  std::vector<int> in, out;  // value ids read and written by one step
};

struct BufferPlan {
  std::vector<int64_t> offset;  // per value id; -1 when the value needs no arena buffer
  int64_t peak_bytes = 0;
  std::vector<int> live_at_peak;  // values live when the peak was reached
  std::string report(const Graph& g) const;  // largest buffers live at the peak
};

// `external` values (graph inputs) live in caller memory; `outputs` stay live to the end.
BufferPlan plan_buffers(const Graph& g, const std::vector<PlanStep>& steps, const std::vector<char>& external,
                        const std::vector<int>& outputs);

}  // namespace px
