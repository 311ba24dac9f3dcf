// What a backend is handed and hands back: a unit of a schedule to make a kernel for, and an event
// for asynchronous work (a copy on its copy stream, a collective of a communicator). The runtime's
// schedule (runtime/schedule.h) produces Units; the communicators (distributed/) return Events.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace px {

// One step of a schedule: a kernel, a fused elementwise group, a view, or the start or wait of a
// collective or copy.
struct Unit {
  enum class Kind { kernel, fused, view, collective_start, collective_wait };
  Kind kind = Kind::kernel;
  std::vector<int> nodes;      // graph nodes it runs (fused: members in order)
  std::vector<int> in_values;  // operands read from outside the unit
  std::vector<int> out_values; // results written (fused: only those read outside the group)
  std::string label;
  bool alias_safe = false;  // a result may share its buffer with an operand (fused loops, in_place primitives)
};

// Started asynchronous work. wait() returns once it is complete (outputs written, inputs free to
// reuse); an event that holds nothing is already complete. Wait exactly once per started call.
class Event {
 public:
  Event() = default;
  explicit Event(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() {
    if (wait_) std::exchange(wait_, nullptr)();
  }
  bool pending() const { return static_cast<bool>(wait_); }

 private:
  std::function<void()> wait_;
};

}  // namespace px
