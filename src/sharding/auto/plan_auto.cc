// The way into the AUTO search from a traced training step (TrainStep on a mesh; px::plan_auto,
// src/train/plan_model.cc, traces a model config and comes here too), and one solve for a mesh
// over several processes.
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "parallax/auto.h"
#include "parallax/communicator.h"
#include "parallax/distributed.h"
#include "sharding/auto/solver.h"
#include "sharding/recipes/step.h"

namespace px {

int64_t autoshard::memory_limit_of(const ShardingOptions& s, const Cluster& c, const Mesh& m) {
  return s.auto_memory_limit_bytes > 0 ? s.auto_memory_limit_bytes : c.device_on(m).memory_bytes;
}

// A traced step as the search sees it. `program` must outlive the model.
autoshard::Model autoshard::model_of(std::shared_ptr<const StepProgram> program, const std::vector<optim::StateSlot>& slots,
                          const std::vector<TensorType>& param_types, const std::vector<TensorType>& batch_types,
                          const Cluster& cluster, const ShardingOptions& sharding, const CompileOptions& compile,
                          const OffloadOptions& offload) {
  autoshard::Model m;
  m.paths = program->paths;
  m.types = param_types;
  m.state_copies.assign(param_types.size(), 0);
  for (const auto& s : slots)
    if (s.type.shape == param_types[s.param].shape) ++m.state_copies[s.param];
  m.cost = [=](const ShardingPlan& plan) {
    const LoweredStep l = lower_train_step(*program, plan, state_specs_for(plan, slots, param_types), batch_types,
                                           sharding, compile, offload);
    return cost_program(l.local, cluster, l.compile);
  };
  return m;
}

namespace {

// A plan as text for the other processes: what they cannot derive themselves (the specs, the batch
// axes, the activation rules and the explanation); each checks the mesh and the params against its own.
std::string plan_text(const ShardingPlan& plan) {
  nlohmann::json j;
  j["mesh"] = plan.mesh.to_string();
  for (const auto& p : plan.params)
    j["params"].push_back({{"path", p.path}, {"spec", p.spec.to_string()}, {"reason", p.reason}});
  j["batch_axes"] = plan.batch_axes;
  for (const auto& r : plan.activations)
    j["activations"].push_back({{"pattern", r.pattern}, {"spec", r.spec.to_string()}});
  j["explanation"] = plan.explanation;
  j["predicted_step_s"] = plan.predicted_step_s;
  return j.dump();
}

ShardingPlan plan_from_text(const std::string& text, const Mesh& mesh, const std::vector<std::string>& paths,
                            const std::vector<TensorType>& types) {
  const nlohmann::json j = nlohmann::json::parse(text);
  const std::string theirs = j.at("mesh").get<std::string>();
  if (theirs != mesh.to_string())
    throw UserError(
        fmt::format("[AUTO] the process holding mesh position 0 planned for the mesh {}, this process "
                    "has {}; build the same mesh on every process",
                    theirs, mesh.to_string()));
  const nlohmann::json& params = j.contains("params") ? j.at("params") : nlohmann::json::array();
  if (params.size() != paths.size())
    throw UserError(
        fmt::format("[AUTO] the process holding mesh position 0 planned {} params, this process has {}; "
                    "build the same model on every process",
                    params.size(), paths.size()));
  ShardingPlan plan;
  plan.mesh = mesh;
  plan.strategy = ShardingStrategy::AUTO;
  for (size_t i = 0; i < paths.size(); ++i) {
    const auto& p = params[i];
    if (p.at("path").get<std::string>() != paths[i])
      throw UserError(
          fmt::format("[AUTO] param {} is '{}' on the process holding mesh position 0 and '{}' here; "
                      "build the same model on every process",
                      i, p.at("path").get<std::string>(), paths[i]));
    ParamPlacement pl;
    pl.path = paths[i];
    pl.type = types[i];
    pl.spec = PartitionSpec::parse(p.at("spec").get<std::string>());
    pl.bytes_per_device = numel(Sharding(mesh, pl.spec).local_shape(types[i].shape)) * dtype_size(types[i].dtype);
    pl.reason = p.at("reason").get<std::string>();
    plan.params.push_back(std::move(pl));
  }
  plan.batch_axes = j.at("batch_axes").get<std::vector<std::string>>();
  if (j.contains("activations"))
    for (const auto& r : j.at("activations"))
      plan.activations.push_back(
          {r.at("pattern").get<std::string>(), PartitionSpec::parse(r.at("spec").get<std::string>())});
  plan.explanation = j.at("explanation").get<std::string>();
  plan.predicted_step_s = j.at("predicted_step_s").get<double>();
  return plan;
}

}  // namespace

ShardingPlan solve_auto_once(const ShardingOptions& sharding, const Mesh& mesh, const std::vector<std::string>& paths,
                             const std::vector<TensorType>& types, const std::function<AutoPlan()>& solve) {
  Communicator* comm = sharding.communicator;
  if (!comm || static_cast<int64_t>(comm->local_positions().size()) == comm->world_size()) {
    AutoPlan a = solve();
    if (!a.fits) throw UserError(a.why);
    return std::move(a.plan);
  }
  // The others wait in a collective for the plan: the solve must end within its timeout.
  if (sharding.auto_time_limit_s >= comm->timeout_s())
    throw UserError(fmt::format(
        "[AUTO] auto_time_limit_s is {} s, but over several processes the others wait for the plan at most "
        "{} s (PX_COLLECTIVE_TIMEOUT_S); lower the time limit or raise PX_COLLECTIVE_TIMEOUT_S",
        sharding.auto_time_limit_s, comm->timeout_s()));
  const auto& local = comm->local_positions();
  const bool first = std::find(local.begin(), local.end(), 0) != local.end();
  // The first process sends its plan, or its error ('!' and the message), so that all throw alike.
  std::string text;
  if (first) {
    try {
      AutoPlan a = solve();
      text = a.fits ? plan_text(a.plan) : "!" + a.why;
    } catch (const std::exception& e) {
      text = std::string("!") + e.what();
    }
  }
  text = share_from_first_process(*comm, text);
  if (!text.empty() && text[0] == '!') throw UserError(text.substr(1));
  try {
    return plan_from_text(text, mesh, paths, types);
  } catch (const nlohmann::json::exception& e) {
    throw InternalError(fmt::format("[AUTO] the plan sent by the process holding mesh position 0 does not read: {}",
                                    e.what()));
  }
}

AutoPlan solve_train_step(const Graph& forward, const StepProgram& program, const std::vector<optim::StateSlot>& slots,
                          const std::vector<TensorType>& param_types, const std::vector<TensorType>& batch_types,
                          const Mesh& mesh, const ShardingOptions& sharding, const CompileOptions& compile,
                          const OffloadOptions& offload) {
  Cluster cluster = load_cluster(sharding.auto_cluster);
  autoshard::Problem p;
  p.forward = &forward;
  p.mesh = cluster.apply(mesh);
  // The search only reads the program: a non-owning pointer is enough while it runs.
  std::shared_ptr<const StepProgram> prog(&program, [](const StepProgram*) {});
  p.full = autoshard::model_of(prog, slots, param_types, batch_types, cluster, sharding, compile, offload);
  p.memory_limit = autoshard::memory_limit_of(sharding, cluster, p.mesh);
  p.options = sharding;
  AutoPlan a = autoshard::solve(p);
  a.plan.mesh = mesh;  // the step's own mesh (its processes), not the costed copy
  return a;
}


}  // namespace px
