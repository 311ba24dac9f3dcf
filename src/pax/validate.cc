// The relations between config fields that no single field's range covers (heads divide the width,
// the schedule's warmup fits its length, sharding rules parse), and what running needs beyond them.
// Apart from the field table (config.cc), so that reading and writing configs needs no model code.
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/log.h"
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

namespace {

bool one_of(const std::string& v, std::initializer_list<const char*> values) {
  for (const char* x : values)
    if (v == x) return true;
  return false;
}

bool has_mesh_axis(const std::string& mesh, const std::string& axis) {
  const size_t at = mesh.find(axis + ":");
  return at != std::string::npos && (at == 0 || mesh[at - 1] == ',');
}

// Settings of fields that the rest of the config makes unused, each with what would make it apply.
// `error`: the field names what the run is about (training data), and ignoring it would train on
// something else; the others are tuning knobs a registered experiment may carry into a setting
// where they do nothing, so they are a warning (docs/pax.md, "Fields that have no effect").
struct Unused {
  std::string message;
  bool error;
};

std::vector<Unused> unused_fields(const ExperimentConfig& c) {
  static const ExperimentConfig defaults;
  std::vector<Unused> out;
  auto check = [&](const char* path, bool applies, const std::string& needs, bool error = false) {
    if (applies || get_field(c, path) == get_field(defaults, path)) return;
    out.push_back({"[pax] " + std::string(path) + "=" + field_text(c, path) + " has no effect here: it applies only " +
                       needs,
                   error});
  };
  const OptimizerConfig& o = c.optimizer;
  const bool adam = one_of(o.name, {"adam", "adamw"});
  for (const char* f : {"optimizer.beta1", "optimizer.beta2", "optimizer.eps"})
    check(f, adam, "with optimizer.name=adamw or adam (here " + o.name + ")");
  check("optimizer.momentum", o.name == "sgd", "with optimizer.name=sgd (here " + o.name + ")");
  const std::string& k = c.schedule.kind;
  const std::string here = " (here " + k + ")";
  check("schedule.warmup_steps", !one_of(k, {"constant"}), "with a schedule.kind other than constant" + here);
  check("schedule.decay_steps", k == "warmup_exponential", "with schedule.kind=warmup_exponential" + here);
  check("schedule.decay_rate", k == "warmup_exponential", "with schedule.kind=warmup_exponential" + here);
  check("schedule.min_fraction", one_of(k, {"warmup_cosine", "warmup_exponential"}),
        "with schedule.kind=warmup_cosine or warmup_exponential" + here);
  check("schedule.total_steps", k == "warmup_cosine", "with schedule.kind=warmup_cosine" + here);
  const ShardingConfig& sh = c.sharding;
  check("sharding.fsdp_min_bytes", one_of(sh.strategy, {"fsdp", "fsdp_tp", "auto"}),
        "with sharding.strategy=fsdp, fsdp_tp or auto (here " + sh.strategy + ")");
  check("sharding.cluster", sh.strategy == "auto",
        "with sharding.strategy=auto (here " + sh.strategy + "); pax plan --cluster costs any plan");
  check("sharding.auto_pipeline", sh.strategy == "auto", "with sharding.strategy=auto (here " + sh.strategy + ")");
  const bool piped = has_mesh_axis(sh.mesh, "stage") || (sh.strategy == "auto" && sh.auto_pipeline);
  const std::string stage = "on a mesh with a stage axis (sharding.mesh=" + (sh.mesh.empty() ? "\"\"" : sh.mesh) +
                            " has none; e.g. stage:2," + (sh.mesh.empty() ? "data:1" : sh.mesh) +
                            ") or with sharding.strategy=auto and sharding.auto_pipeline=true";
  for (const char* f : {"sharding.schedule", "sharding.virtual_stages", "sharding.balance_stages",
                        "sharding.layers_per_stage"})
    check(f, piped, stage);
  check("memory.budget_bytes", c.memory.remat == "auto", "with memory.remat=auto (here " + c.memory.remat + ")");
  check("memory.prefetch_depth", c.memory.offload != "none", "with a memory.offload other than none");
  const bool text = c.data.kind == "text";
  for (const char* f : {"data.paths", "data.cache_dir", "data.eval_fraction", "data.max_documents", "data.max_document_bytes",
                        "tokenizer.model"})
    check(f, text, "with data.kind=text (here " + c.data.kind + ", which trains on the built-in copy task)", true);
  check("data.copy_eval_batches", c.data.kind == "copy_task", "with data.kind=copy_task (here " + c.data.kind + ")");
  return out;
}

}  // namespace

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
  // Fields the rest of the config leaves unused: an error, or a warning logged once per process.
  for (const Unused& u : unused_fields(c)) {
    if (u.error) throw UserError(u.message + "; set that, or drop the field");
    static std::mutex mu;
    static std::set<std::string> warned;
    std::lock_guard<std::mutex> lock(mu);
    if (warned.insert(u.message).second) PX_LOG(warn) << u.message;
  }
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
