// TrainStep's single-file import on arbitrary bytes: import_safetensors (a safetensors file and its
// "step" and "optimizer" metadata) and the check of the imported state against a fixed small
// layout (names, types, optimizer), as TrainStep::load of a ".safetensors" path runs them.
#include <cstdlib>
#include <string>

#include "checkpoint/state.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  px::ckpt::StateLayout layout;
  layout.names = {"w", "b", "w.m", "b.m"};
  layout.types = {{px::DType::f32, {2, 3}}, {px::DType::f32, {3}}, {px::DType::f32, {2, 3}}, {px::DType::f32, {3}}};
  layout.n_params = 2;
  layout.optimizer = "sgd";
  px::fuzz::MemFile f(data, size);
  try {
    px::Checkpoint c = px::import_safetensors(f.path());
    if (c.step < 0) std::abort();
    px::ckpt::check_state(px::ckpt::array_infos(c), c.optimizer, layout, "fuzz");
    // What passes the check is exactly the layout, each tensor whole on one device.
    if (c.entries.size() != layout.names.size()) std::abort();
    for (size_t i = 0; i < layout.names.size(); ++i)
      if (c.get(layout.names[i]).type() != layout.types[i] || c.full(layout.names[i]).type() != layout.types[i])
        std::abort();
  } catch (const px::Error&) {
  }
  return 0;
}
