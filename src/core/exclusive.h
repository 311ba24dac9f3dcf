// One call at a time on an object that keeps per-call state in its members (an executable that
// patches buffer pointers in place, a training step that reuses its input and output lists): a
// second call while one is under way throws, so concurrent use is an error, never a wrong result.
// The object holds a `std::atomic<bool> busy_{false}`; each such call starts with
// `ExclusiveCall call(busy_, "training step");`.
#pragma once

#include <atomic>
#include <string>

#include "parallax/core.h"

namespace px {

class ExclusiveCall {
 public:
  // `what` names the object in the error.
  ExclusiveCall(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    if (busy_.exchange(true, std::memory_order_acquire))
      throw UserError(std::string("[run] this ") + what +
                      " is already running on another thread; it runs one call at a time: make one per thread, "
                      "or serialize the calls");
  }
  ~ExclusiveCall() { busy_.store(false, std::memory_order_release); }
  ExclusiveCall(const ExclusiveCall&) = delete;
  ExclusiveCall& operator=(const ExclusiveCall&) = delete;

 private:
  std::atomic<bool>& busy_;
};

}  // namespace px
