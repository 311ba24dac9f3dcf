// The model-level planning API (parallax/plan.h): a TransformerLm next-token step traced from its
// config (params declared, never allocated), then costed per recipe or searched by AUTO exactly as
// TrainStep on the mesh would decide it.
#include <fmt/format.h>

#include <cctype>

#include <algorithm>
#include <chrono>

#include "parallax/nn.h"
#include "parallax/plan.h"
#include "sharding/auto/solver.h"
#include "train/pipeline_step.h"
#include "train/steps.h"

namespace px {
namespace {

// What a StepSetup means for a config: the sequence length (the config's when not given), the
// config stretched to it, the optimizer (AdamW when not given) and the batch's types.
struct SetupOf {
  nn::LmConfig cfg;
  optim::OptimizerPtr opt;
  std::vector<TensorType> batch_types;
};

SetupOf setup_of(const nn::LmConfig& cfg_in, const StepSetup& setup, const char* who) {
  SetupOf r{cfg_in, setup.optimizer ? setup.optimizer : optim::adamw({}), {}};
  const int64_t seq = setup.seq > 0 ? setup.seq : r.cfg.max_seq_len;
  if (seq <= 0)
    throw UserError(std::string("[") + who + "] no sequence length: set StepSetup::seq or the config's max_seq_len");
  if (setup.batch <= 0)
    throw UserError(std::string("[") + who + "] batch must be positive, got " + std::to_string(setup.batch));
  r.cfg.max_seq_len = std::max(r.cfg.max_seq_len, seq);
  r.cfg.validate();
  r.batch_types = {{DType::i32, {setup.batch, seq}}, {DType::i32, {setup.batch, seq}}};
  return r;
}

// What a StepSetup asks of a pipelined step on `mesh`.
TrainStepOptions pipelined_options(const Mesh& mesh, ShardingStrategy strategy, const StepSetup& setup,
                                   const PipelineOptions& pipeline) {
  TrainStepOptions o;
  o.mesh = mesh;
  o.strategy = strategy;
  o.sharding = setup.sharding;
  o.clip_norm = setup.clip_norm;
  o.microbatches = setup.microbatches;
  o.remat = setup.remat;
  o.compile.compute_dtype = setup.compute_dtype;
  o.pipeline = pipeline;
  return o;
}

}  // namespace

std::vector<RecipeCost> cost_recipes(const nn::LmConfig& cfg_in, const Mesh& mesh, const Cluster& cluster,
                                     const StepSetup& setup, const std::vector<ShardingStrategy>& strategies) {
  const auto [cfg, opt, batch_types] = setup_of(cfg_in, setup, "cost_recipes");
  nn::TransformerLm model(cfg);  // declares params (types and paths); allocates none
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); };
  TrainStepOptions to;
  to.clip_norm = setup.clip_norm;
  to.microbatches = setup.microbatches;
  to.remat = setup.remat;
  to.offload = setup.offload;
  to.compile.compute_dtype = setup.compute_dtype;

  std::vector<RecipeCost> out;
  for (ShardingStrategy s : strategies) {
    RecipeCost rc;
    rc.strategy = s;
    auto t0 = std::chrono::steady_clock::now();
    try {
      TrainStepOptions o = to;
      o.mesh = mesh;
      o.strategy = s;
      o.sharding = setup.sharding;
      DecidedStep d = detail::decide_step(model.store(), *opt, loss, batch_types, o);
      const LoweredStep l =
          lower_train_step(d.program, d.plan, d.state_specs, batch_types, o.sharding, to.compile, to.offload);
      rc.cost = cost_program(l.local, cluster, l.compile);
      rc.param_bytes_per_device = d.plan.param_bytes_per_device();
      rc.applies = true;
    } catch (const Error& e) {
      rc.applies = false;
      rc.reason = e.what();
    }
    rc.plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(rc));
  }
  return out;
}

AutoPlan plan_auto(const nn::LmConfig& cfg_in, const Mesh& mesh_in, const Cluster& cluster, const StepSetup& setup) {
  const auto [cfg, opt, batch_types] = setup_of(cfg_in, setup, "plan_auto");
  CompileOptions compile;
  compile.compute_dtype = setup.compute_dtype;
  const Mesh mesh = mesh_in;

  // Traces the step of `c` (nothing allocated) into a search model; keeps the forward graph.
  std::vector<std::unique_ptr<Graph>> forwards;
  auto traced = [&](const nn::LmConfig& c) {
    nn::TransformerLm model(c);
    TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); };
    forwards.push_back(nn::trace_with_params(
        model.store(), [&](const std::vector<Tensor>& b) { return std::vector<Tensor>{loss(b)}; }, batch_types));
    auto program = std::make_shared<const StepProgram>(
        remat_step(trace_train_step(model.store(), *opt, loss, batch_types, setup.clip_norm, "plan_auto", false,
                                    setup.microbatches),
                   setup.remat));
    std::vector<TensorType> types = model.store().types();
    return autoshard::model_of(program, opt->state_slots(types), types, batch_types, cluster, setup.sharding, compile,
                               setup.offload);
  };

  autoshard::Problem p;
  p.full = traced(cfg);
  p.forward = forwards.back().get();
  if (cfg.n_layers > 2) {
    nn::LmConfig c1 = cfg, c2 = cfg;
    c1.n_layers = 1;
    c2.n_layers = 2;
    p.one_layer = traced(c1);
    p.two_layers = traced(c2);
    p.layers = cfg.n_layers;
  }
  p.mesh = mesh;
  p.memory_limit = autoshard::memory_limit_of(setup.sharding, cluster, mesh);
  p.options = setup.sharding;
  return autoshard::solve(p);
}

std::string PipelineCandidate::settings() const {
  std::string m, recipe = strategy_name(strategy);
  for (const MeshAxis& a : mesh.axes()) m += (m.empty() ? "" : ",") + a.name + ":" + std::to_string(a.size);
  for (char& ch : recipe) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return fmt::format(
      "--set sharding.mesh={} --set sharding.strategy={} --set sharding.schedule={} --set train.microbatches={}{}", m,
      recipe, pipeline::kind_name(pipeline.schedule), microbatches,
      pipeline.balance ? " --set sharding.balance_stages=true" : "");
}

std::vector<PipelineCandidate> search_pipelines(const nn::LmConfig& cfg_in, int64_t devices, const Cluster& cluster,
                                                const StepSetup& setup, double time_limit_s) {
  const auto [cfg, opt, batch_types] = setup_of(cfg_in, setup, "search_pipelines");
  nn::TransformerLm model(cfg);  // declares params (types and paths); allocates none
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); };
  const int64_t layers = cfg.n_layers;
  return detail::pipeline_candidates(
      model.store(), *opt, loss, batch_types,
      pipelined_options(Mesh({{"data", devices, {}}}), ShardingStrategy::DDP, setup, {}), cluster,
      [&](int64_t S) { return S <= layers && layers % S == 0; }, time_limit_s);
}

PipelineReport plan_pipeline(const nn::LmConfig& cfg_in, const Mesh& mesh, ShardingStrategy strategy,
                             const StepSetup& setup, const PipelineOptions& pipeline, const Cluster* cluster) {
  const auto [cfg, opt, batch_types] = setup_of(cfg_in, setup, "plan_pipeline");
  nn::TransformerLm model(cfg);  // declares params (types and paths); allocates none
  TrainStep::LossFn loss = [&](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1]); };
  detail::BuiltStep p = detail::build_step(model.store(), *opt, loss, batch_types,
                                                    pipelined_options(mesh, strategy, setup, pipeline), cluster,
                                                    /*compile=*/false);
  return detail::pipeline_report(p.staged);
}

}  // namespace px
