// The relations between config fields that no single field's range covers (heads divide the width,
// the schedule's warmup fits its length, sharding rules parse), and what running needs beyond them.
// Apart from the field table (config.cc), so that reading and writing configs needs no model code.
#include <cstdlib>

#include "parallax/pax.h"
#include "parallax/sharding.h"
#include "pax/model.h"

namespace px::pax {

optim::Schedule make_schedule(const ExperimentConfig& c) {
  const ScheduleConfig& s = c.schedule;
  const double lr = c.optimizer.lr;
  if (s.kind == "linear_warmup") return optim::linear_warmup(lr, s.warmup_steps);
  if (s.kind == "warmup_cosine")
    return optim::warmup_cosine(lr, s.warmup_steps, s.total_steps > 0 ? s.total_steps : c.train.steps, s.min_fraction);
  if (s.kind == "warmup_exponential")
    return optim::warmup_exponential(lr, s.warmup_steps, s.decay_steps, s.decay_rate, s.min_fraction);
  if (s.kind == "rsqrt") return optim::rsqrt(lr, s.warmup_steps);
  return optim::constant(lr);
}

void validate(const ExperimentConfig& c) {
  // Each field in its range (set_field_value checks the value it stores).
  ExperimentConfig checked = c;
  for (const FieldInfo& f : fields()) set_field_value(checked, f.path, get_field(c, f.path));
  const ModelConfig& m = c.model;
  if (m.d_model % m.n_heads != 0)
    throw Error("[pax] model.d_model=" + std::to_string(m.d_model) +
                " is not divisible by model.n_heads=" + std::to_string(m.n_heads));
  if (m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads != 0)
    throw Error("[pax] model.n_heads=" + std::to_string(m.n_heads) +
                " is not divisible by model.n_kv_heads=" + std::to_string(m.n_kv_heads));
  try {
    make_schedule(c);  // the schedule checks its own relations (warmup < total, ...)
  } catch (const Error& e) {
    throw Error("[pax] schedule.kind=" + c.schedule.kind + ": " + e.what() +
                "; lower schedule.warmup_steps or raise train.steps (or schedule.total_steps)");
  }
  const int64_t mb = c.train.microbatches, batch = c.data.batch;
  if (batch % mb != 0)
    throw Error("[pax] train.microbatches=" + std::to_string(mb) + " does not divide data.batch=" +
                std::to_string(batch) + ": each step's batch is split into microbatches of equal rows; set "
                "train.microbatches to a divisor of data.batch or data.batch to a multiple of it");
  // Each data shard's rows are split into the microbatches: the data axis's size as the mesh names it.
  const std::string axis = c.sharding.data_axis + ":";
  const size_t at = c.sharding.mesh.find(axis);
  const bool named = at != std::string::npos && (at == 0 || c.sharding.mesh[at - 1] == ',');
  const int64_t shards = named ? std::atoll(c.sharding.mesh.c_str() + at + axis.size()) : 0;
  if (shards > 1 && batch % shards == 0 && (batch / shards) % mb != 0)
    throw Error("[pax] train.microbatches=" + std::to_string(mb) + " does not divide the " +
                std::to_string(batch / shards) + " sequences of each of the " + std::to_string(shards) +
                " data shards (data.batch=" + std::to_string(batch) + " over sharding.mesh " + c.sharding.mesh +
                "): each shard's microbatches are its own rows; set data.batch to a multiple of " +
                std::to_string(shards * mb) + " or train.microbatches to a divisor of " +
                std::to_string(batch / shards));
  for (const std::string& r : c.sharding.rules) {
    size_t eq = r.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error("[pax] sharding.rules: '" + r + "' is not glob=P(...), e.g. blocks.*.mlp.fc.w=P(None, 'model')");
    try {
      std::string spec = r.substr(eq + 1);
      spec.erase(0, spec.find_first_not_of(" \t"));
      spec.erase(spec.find_last_not_of(" \t") + 1);
      PartitionSpec::parse(spec);
    } catch (const Error& e) {
      throw Error("[pax] sharding.rules: '" + r + "': " + e.what());
    }
  }
}

void check_runnable(const ExperimentConfig& c) {
  validate(c);
  if (c.memory.remat == "auto" && c.memory.budget_bytes <= 0)
    throw Error(
        "[pax] memory.remat=auto needs memory.budget_bytes: the planned per-device peak to fit, in bytes "
        "(e.g. --set memory.budget_bytes=8000000000); or name a policy: full, dots_saveable, ...");
  if (c.memory.remat == "auto" && c.sharding.strategy == "auto")
    throw Error(
        "[pax] memory.remat=auto with sharding.strategy=auto is not available yet: name a remat policy "
        "(full, dots_saveable, ...) and AUTO plans around it");
}

}  // namespace px::pax
