// Checking a checkpoint against the state a training step expects (state.h).
#include "checkpoint/state.h"

#include <algorithm>
#include <map>

namespace px::ckpt {

void check_state(const std::vector<CheckpointArrayInfo>& arrays, const std::string& optimizer, const StateLayout& l,
                 const std::string& where) {
  // Another optimizer's state could share tensor names (SGD's momentum and nothing else): reject
  // it rather than resume with state that means something else.
  if (!optimizer.empty() && optimizer != l.optimizer)
    throw UserError(where + ": was saved with the optimizer '" + optimizer + "' but this step uses '" + l.optimizer +
                    "'; load it with a step of the same optimizer, or read its params alone (px::read_checkpoint "
                    "with RestoreOptions::group = \"params\") and start fresh optimizer state with init(params)");
  std::map<std::string, const CheckpointArrayInfo*> have;
  for (const CheckpointArrayInfo& a : arrays) have[a.name] = &a;
  // A tensor the model does not have means another model (e.g. more layers): never drop it silently.
  std::vector<std::string> extra;
  for (const CheckpointArrayInfo& a : arrays)
    if (std::find(l.names.begin(), l.names.end(), a.name) == l.names.end()) extra.push_back("'" + a.name + "'");
  if (!extra.empty()) {
    std::string list;
    for (size_t i = 0; i < extra.size() && i < 8; ++i) list += (i ? ", " : "") + extra[i];
    throw UserError(
        where + ": has " + std::to_string(extra.size()) + " tensor" + (extra.size() == 1 ? "" : "s") +
        " this model and optimizer do not have: " + list + (extra.size() > 8 ? ", ..." : "") +
        "; was it saved from a different model? (px::read_checkpoint, or px::import_safetensors for a file, reads "
        "tensors by name)");
  }
  for (size_t i = 0; i < l.names.size(); ++i) {
    auto it = have.find(l.names[i]);
    if (it == have.end())
      throw UserError(where + ": has no tensor '" + l.names[i] + "'; was it saved from a different " +
                      (i < l.n_params ? "model" : "model or optimizer") + "? Load it with the step that saved it");
    if (it->second->type != l.types[i])
      throw UserError(where + ": tensor '" + l.names[i] + "' is " + type_str(it->second->type) +
                      " but this model expects " + type_str(l.types[i]) +
                      "; was it saved from a different model? Load it with the step that saved it");
  }
}

std::vector<CheckpointArrayInfo> array_infos(const Checkpoint& c) {
  std::vector<CheckpointArrayInfo> out;
  for (const CheckpointEntry& e : c.entries) {
    CheckpointArrayInfo a;
    a.name = e.name;
    a.group = e.group;
    a.type = e.array.type();
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace px::ckpt
