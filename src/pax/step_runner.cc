#include "pax/step_runner.h"

#include "pax/model.h"

namespace px::pax {
namespace {

TrainStep::LossFn loss_fn(nn::TransformerLm& model) {
  return [&model](const std::vector<Tensor>& b) { return nn::next_token_loss(model, b[0], b[1], b[2]); };
}

TrainStepOptions step_options(const ExperimentConfig& c) {
  TrainStepOptions o;
  o.clip_norm = c.optimizer.clip_norm;
  return o;
}

class SingleRunner : public StepRunner {
 public:
  SingleRunner(const ExperimentConfig& c, nn::TransformerLm& model)
      : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), step_options(c)),
        state_(step_.init(c.train.seed)) {}
  StepMetrics step(const std::vector<Array>& batch) override { return step_(state_, batch); }
  std::vector<Array> params() const override { return state_.params; }
  int64_t step_count() const override { return state_.step; }
  void set_params(const std::vector<Array>& params) override { state_ = step_.init(params); }
  void save(const std::string& file) const override { step_.save(file, state_); }
  void load(const std::string& file) override { state_ = step_.load(file); }

 private:
  TrainStep step_;
  TrainState state_;
};

class ShardedRunner : public StepRunner {
 public:
  ShardedRunner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh)
      : step_(model.store(), make_optimizer(c), loss_fn(model), batch_types(c), mesh, strategy_of(c),
              sharding_options(c), step_options(c)),
        state_(step_.init(c.train.seed)) {}
  StepMetrics step(const std::vector<Array>& batch) override { return step_(state_, batch); }
  std::vector<Array> params() const override { return step_.gather_params(state_); }
  int64_t step_count() const override { return state_.step; }
  void set_params(const std::vector<Array>& params) override { state_ = step_.init(params); }
  void save(const std::string& file) const override { step_.save(file, state_); }
  void load(const std::string& file) override { state_ = step_.load(file); }

 private:
  ShardedTrainStep step_;
  ShardedTrainState state_;
};

}  // namespace

std::unique_ptr<StepRunner> make_step_runner(const ExperimentConfig& c, nn::TransformerLm& model, const Mesh& mesh) {
  if (mesh.size() > 1) return std::make_unique<ShardedRunner>(c, model, mesh);
  return std::make_unique<SingleRunner>(c, model);
}

}  // namespace px::pax
