// The two ways into the AUTO search: a traced training step (ShardedTrainStep) and a
// TransformerLm config from shapes alone (px::plan_auto, bench/plan, pax plan).
#include <memory>

#include "parallax/auto.h"
#include "parallax/nn.h"
#include "sharding/auto/solver.h"
#include "sharding/recipes/step.h"

namespace px {
namespace {

int64_t memory_limit_of(const ShardingOptions& s, const Cluster& c, const Mesh& m) {
  return s.auto_memory_limit_bytes > 0 ? s.auto_memory_limit_bytes : c.device_on(m).memory_bytes;
}

// A traced step as the search sees it. `program` must outlive the model.
autoshard::Model model_of(std::shared_ptr<const StepProgram> program, const std::vector<optim::StateSlot>& slots,
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
    std::vector<PartitionSpec> specs = state_specs_for(plan, slots, param_types);
    ShardingDecision d = decide_train_step(*program, plan, specs, batch_types, bucket_bytes_for(plan, sharding));
    SpmdProgram local = partition(*program->graph, d, program->categories);
    CompileOptions c = compile;
    offload_local(local, *program, offload, c);
    return cost_program(local, cluster, c);
  };
  return m;
}

}  // namespace

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
  p.full = model_of(prog, slots, param_types, batch_types, cluster, sharding, compile, offload);
  p.memory_limit = memory_limit_of(sharding, cluster, p.mesh);
  p.options = sharding;
  AutoPlan a = autoshard::solve(p);
  a.plan.mesh = mesh;  // the step's own mesh (its processes), not the costed copy
  return a;
}

AutoPlan plan_auto(const nn::LmConfig& cfg_in, const Mesh& mesh_in, const Cluster& cluster, const StepSetup& setup) {
  nn::LmConfig cfg = cfg_in;
  const int64_t seq = setup.seq > 0 ? setup.seq : cfg.max_seq_len;
  if (seq <= 0) throw UserError("[plan_auto] no sequence length: set StepSetup::seq or the config's max_seq_len");
  if (setup.batch <= 0) throw UserError("[plan_auto] batch must be positive, got " + std::to_string(setup.batch));
  cfg.max_seq_len = std::max(cfg.max_seq_len, seq);
  cfg.validate();
  optim::OptimizerPtr opt = setup.optimizer ? setup.optimizer : optim::adamw({});
  std::vector<TensorType> batch_types{{DType::i32, {setup.batch, seq}}, {DType::i32, {setup.batch, seq}}};
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
    auto program = std::make_shared<const StepProgram>(remat_step(
        trace_train_step(model.store(), *opt, loss, batch_types, setup.clip_norm, "plan_auto", false), setup.remat));
    std::vector<TensorType> types = model.store().types();
    return model_of(program, opt->state_slots(types), types, batch_types, cluster, setup.sharding, compile,
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
  p.memory_limit = memory_limit_of(setup.sharding, cluster, mesh);
  p.options = setup.sharding;
  return autoshard::solve(p);
}

}  // namespace px
