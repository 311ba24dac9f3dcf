// read_checkpoint (a safetensors file plus its "step" and "optimizer" metadata) on arbitrary
// bytes, against a fixed small layout; and the step text parser on the raw input.
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "train/state_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    int64_t step = px::detail::parse_checkpoint_step(std::string(reinterpret_cast<const char*>(data), size), "x");
    if (step < 0 || step > 2147483646) std::abort();
  } catch (const px::Error&) {
  }
  px::detail::CheckpointLayout layout;
  layout.names = {"w", "b", "w.m", "b.m"};
  layout.types = {{px::DType::f32, {2, 3}}, {px::DType::f32, {3}}, {px::DType::f32, {2, 3}}, {px::DType::f32, {3}}};
  layout.n_params = 2;
  layout.optimizer = "sgd";
  px::fuzz::MemFile f(data, size);
  try {
    px::detail::FullState s = px::detail::read_checkpoint(f.path(), layout);
    if (s.params.size() != 2 || s.opt_state.size() != 2 || s.step < 0) std::abort();
    for (size_t i = 0; i < 4; ++i)
      if ((i < 2 ? s.params[i] : s.opt_state[i - 2]).type() != layout.types[i]) std::abort();
  } catch (const px::Error&) {
  }
  return 0;
}
