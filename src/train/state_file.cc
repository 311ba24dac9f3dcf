// Reading training checkpoints and the step counter's limits (no model or runtime needed here, so
// the checkpoint fuzz target links only core and io).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "train/state_file.h"
#include "parallax/io.h"

namespace px::detail {

int32_t traced_step(int64_t step, const std::string& who) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() - 1;
  if (step < 0 || step > kMax)
    throw UserError(fmt::format("[{}] the state's step is {}; it must be in [0, {}] (the traced step counter is i32 "
                                "and the update uses step + 1); start from a state with a smaller step",
                                who, step, kMax));
  return static_cast<int32_t>(step);
}

int64_t parse_checkpoint_step(const std::string& text, const std::string& path) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max() - 1;
  bool digits = !text.empty() && text.size() <= 18 &&
                std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  int64_t v = 0;
  if (digits)
    for (char c : text) v = v * 10 + (c - '0');
  if (!digits || v > kMax)
    throw UserError(fmt::format("{}: metadata 'step' is '{}'; it must be a decimal integer in [0, {}] (the number "
                                "of updates applied); was the file written by TrainStep::save?",
                                path, text, kMax));
  return v;
}

StepMetrics step_metrics(float loss, float grad_norm, float lr, bool skip) {
  StepMetrics m;
  m.loss = loss;
  m.grad_norm = grad_norm;
  m.lr = lr;
  m.finite = std::isfinite(loss) && std::isfinite(grad_norm);
  m.skipped = skip && !m.finite;
  return m;
}

FullState read_checkpoint(const std::string& path, const CheckpointLayout& layout) {
  SafetensorsFile f = load_safetensors(path);
  // Another optimizer's state could share tensor names (SGD's momentum and nothing else): reject
  // it rather than resume with state that means something else.
  auto opt = f.metadata.find("optimizer");
  if (opt != f.metadata.end() && opt->second != layout.optimizer)
    throw Error(path + ": was saved with the optimizer '" + opt->second + "' but this step uses '" + layout.optimizer +
                "'; load it with a step of the same optimizer, or read its params with px::load_safetensors and "
                "start fresh optimizer state with init(params)");
  // A tensor the model does not have means another model (e.g. more layers): never drop it silently.
  std::set<std::string> expected(layout.names.begin(), layout.names.end());
  std::vector<std::string> extra;
  for (const std::string& n : f.names)
    if (!expected.count(n)) extra.push_back("'" + n + "'");
  if (!extra.empty())
    throw UserError(fmt::format("{}: has {} tensor{} this model and optimizer do not have: {}{}; was it saved from a "
                                "different model? (read it with px::load_safetensors to pick tensors by hand)",
                                path, extra.size(), extra.size() == 1 ? "" : "s",
                                fmt::join(extra.begin(), extra.begin() + std::min<size_t>(extra.size(), 8), ", "),
                                extra.size() > 8 ? ", ..." : ""));
  FullState s;
  for (size_t i = 0; i < layout.names.size(); ++i) {
    const std::string& name = layout.names[i];
    if (!f.contains(name))
      throw Error(path + ": has no tensor '" + name + "'; was it saved from a different model or optimizer?");
    const Array& a = f.get(name);
    if (a.type() != layout.types[i])
      throw Error(path + ": tensor '" + name + "' is " + type_str(a.type()) + " but this model expects " +
                  type_str(layout.types[i]));
    (i < layout.n_params ? s.params : s.opt_state).push_back(a);
  }
  auto it = f.metadata.find("step");
  if (it == f.metadata.end()) throw Error(path + ": the metadata has no 'step'");
  s.step = parse_checkpoint_step(it->second, path);
  return s;
}

}  // namespace px::detail
