#include "pax/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <utility>

#include "parallax/communicator.h"
#include "pax/model.h"

namespace px::pax {

namespace {
CheckpointOptions options(int64_t keep) {
  CheckpointOptions o;
  o.keep_last = static_cast<int>(keep);
  // Several processes: each writes its own shards; process 0 commits between the barriers.
  if (const ProcessWorld* w = launched_world(); w && w->size > 1) {
    o.processes.index = w->rank;
    o.processes.barrier = [comm = w->communicator](const std::string&) { comm->barrier(); };
  }
  return o;
}
}  // namespace

Checkpoints::Checkpoints(const std::string& job_dir, int64_t keep) : mgr_(job_dir + "/checkpoints", options(keep)) {}

std::string Checkpoints::path(int64_t step) const { return mgr_.path(step); }
std::vector<int64_t> Checkpoints::steps() const { return mgr_.steps(); }
std::optional<int64_t> Checkpoints::latest() const { return mgr_.latest_step(); }
void Checkpoints::wait() { mgr_.wait(); }

std::string Checkpoints::steps_text() const {
  std::string list;
  for (int64_t s : steps()) list += (list.empty() ? "" : ", ") + std::to_string(s);
  return list.empty() ? "none" : list;
}

std::optional<int64_t> Checkpoints::newly_committed() {
  if (!unreported_) return std::nullopt;
  std::vector<int64_t> all = steps();
  if (std::find(all.begin(), all.end(), *unreported_) == all.end()) return std::nullopt;
  return std::exchange(unreported_, std::nullopt);
}

std::optional<int64_t> Checkpoints::finish() {
  mgr_.wait();
  return std::exchange(unreported_, std::nullopt);
}

void Checkpoints::save(int64_t step, const StepRunner& runner, const std::string& config_json,
                       const std::string& data_state) {
  Checkpoint c = runner.snapshot();
  if (c.step != step)
    throw InternalError("[pax] checkpoint of step " + std::to_string(step) + " holds step " + std::to_string(c.step));
  c.config_json = config_json;
  c.data_state_json = data_state.empty() ? "null" : data_state;
  // Over several processes the save's barriers are collectives: they must run on this thread, in
  // step with the others' (an asynchronous save would meet them from a background thread).
  if (const ProcessWorld* w = launched_world(); w && w->size > 1) {
    mgr_.save(c);
    w->communicator->barrier();  // committed by process 0 before anyone goes on
    unreported_ = step;
    return;
  }
  mgr_.save_async(c);
  unreported_ = step;
}

std::vector<std::string> Checkpoints::set_aside_after(int64_t step) {
  mgr_.wait();
  std::vector<std::string> moved;
  for (int64_t s : steps())
    if (s > step) {
      std::string to = path(s) + ".discarded";
      for (int k = 1; std::filesystem::exists(to); ++k) to = path(s) + ".discarded." + std::to_string(k);
      std::error_code ec;
      std::filesystem::rename(path(s), to, ec);
      if (ec) throw Error("[pax] cannot set aside '" + path(s) + "' as '" + to + "': " + ec.message());
      moved.push_back(to);
    }
  return moved;
}

std::string Checkpoints::restore(int64_t step, StepRunner& runner) const {
  try {
    Checkpoint c = mgr_.restore(step, runner.restore_options());
    runner.restore(c);
    return c.data_state_json == "null" ? std::string() : c.data_state_json;
  } catch (const Error& e) {
    std::optional<int64_t> before;
    for (int64_t s : steps())
      if (s < step) before = s;
    throw Error("[pax] cannot restore '" + path(step) + "' (a different model or optimizer, or a damaged file; " +
                (before ? "pass --restore_step=" + std::to_string(*before) +
                              " to resume from the one before, which sets the newer ones aside"
                        : std::string("no earlier checkpoint to resume from")) +
                "): " + e.what());
  }
}

std::vector<Array> Checkpoints::params(std::optional<int64_t>& step, const nn::TransformerLm& model) const {
  if (!step) step = latest();
  if (!step) throw Error("[pax] no checkpoint in '" + mgr_.dir() + "'; run 'pax train' first");
  std::vector<int64_t> all = steps();
  if (std::find(all.begin(), all.end(), *step) == all.end())
    throw Error("[pax] no checkpoint at step " + std::to_string(*step) + " in '" + mgr_.dir() +
                "'; the committed steps are " + steps_text() + " (leave out --step for the latest)");
  RestoreOptions ro;
  ro.group = "params";
  Checkpoint c = mgr_.restore(*step, ro);
  std::vector<Array> out;
  for (const nn::ParamSpec& p : model.store().specs()) {
    if (!c.contains(p.path))
      throw Error("[pax] checkpoint '" + path(*step) + "' has no param '" + p.path + "' (a different model?)");
    Array a = c.full(p.path);
    if (a.type() != p.type)
      throw Error("[pax] checkpoint param '" + p.path + "' is " + type_str(a.type()) + " but the model wants " +
                  type_str(p.type));
    out.push_back(std::move(a));
  }
  return out;
}

}  // namespace px::pax
