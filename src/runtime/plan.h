// Liveness-based buffer plan: every buffer that crosses a step boundary gets an offset in one
// arena; buffers whose last reader has run are reused. The peak is known before running.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace px {

struct PlanStep {
  std::vector<int> in, out;  // buffer ids read and written by one step
};

struct BufferPlan {
  std::vector<int64_t> offset;    // per buffer; -1 when the buffer needs no arena space
  int64_t peak_bytes = 0;         // arena size (live bytes at the worst step plus fragmentation)
  int64_t peak_live_bytes = 0;    // most bytes live at once
  int peak_step = -1;             // the step at which peak_live_bytes is reached
  std::vector<int> live_at_peak;  // buffers live at peak_step
  std::vector<int> first_step, last_step;  // per arena buffer: the steps it is live in (inclusive)
};

// `sizes` per buffer (bytes); `external` buffers live in caller memory; `live_to_end` stay live to
// the end. A buffer is allocated at the first step that writes it and freed after its last reader.
// Offsets: best fit in step order, or, when smaller, the largest buffers first over their known
// lifetimes.
BufferPlan plan_buffers(const std::vector<int64_t>& sizes, const std::vector<PlanStep>& steps,
                        const std::vector<char>& external, const std::vector<int>& live_to_end);

// The most bytes of arena buffers that must be alive together in any order of the steps that keeps
// their dependences (a step depends on the steps that write what it reads): a buffer must be alive
// at step u when its writer is u or an ancestor of u and one of its readers is u or a descendant
// (buffers in `live_to_end` are read at the end). Returns {bytes, step}; {0, -1} without buffers.
// With `phase` (one entry per step), the steps of phase 1 also depend on every step of phase 0 (a
// training step's backward pass and update run after its forward pass); steps of phase 2 (copies
// and collectives) only on what they read. Programs of more than
// `max_steps` steps are not analysed: {-1, -1}.
std::pair<int64_t, int> must_live_bytes(const std::vector<int64_t>& sizes, const std::vector<PlanStep>& steps,
                                        const std::vector<char>& external, const std::vector<int>& live_to_end,
                                        const std::vector<char>& phase = {}, size_t max_steps = 40000);

constexpr int64_t kBufferAlign = 64;
inline int64_t aligned_size(int64_t n) { return (std::max<int64_t>(n, 1) + kBufferAlign - 1) / kBufferAlign * kBufferAlign; }

}  // namespace px
