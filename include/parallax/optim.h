// px::optim: optimizers whose update is traced ops (so their state can be sharded and
// offloaded like any other value), global-norm clipping, and learning-rate schedules.
//
//   auto opt = px::optim::adamw({.lr = px::optim::warmup_cosine(3e-4, 200, 10000), .weight_decay = 0.1,
//                                .decay_mask = px::optim::rank_at_least(2)});
//   std::vector<px::Array> state = opt->init_state(params);            // host zeros
//   // inside a traced step, with step = the 1-based number of this update:
//   auto [clipped, norm] = px::optim::clip_by_global_norm(grads, 1.0);
//   px::optim::Update u = opt->apply(params, clipped, state, step, param_paths);
//   // u.params and u.state replace params and state; u.lr is the traced learning rate.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "parallax/graph.h"

namespace px::optim {

// ---- learning-rate schedules ---------------------------------------------------------------
// `step` is the 1-based number of the update being applied (the first update is step 1).

class ScheduleImpl {
 public:
  virtual ~ScheduleImpl() = default;
  virtual double at(int64_t step) const = 0;
  virtual Tensor lr(const Tensor& step) const = 0;  // step: scalar i32 or f32; returns scalar f32
  virtual std::string describe() const = 0;
};

// A shared, immutable schedule; a plain number converts to a constant schedule.
class Schedule {
 public:
  Schedule(double constant_value);  // NOLINT: implicit, so `.lr = 1e-3` works
  Schedule(std::shared_ptr<const ScheduleImpl> impl) : impl_(std::move(impl)) {}  // NOLINT
  double at(int64_t step) const { return impl_->at(step); }                       // host value, double precision
  Tensor lr(const Tensor& step) const;                                            // traced value, f32 scalar
  std::string describe() const { return impl_->describe(); }  // e.g. "warmup_cosine(peak=0.0003, ...)"

 private:
  std::shared_ptr<const ScheduleImpl> impl_;
};

Schedule constant(double value);
// peak * min(1, step / warmup_steps).
Schedule linear_warmup(double peak, int64_t warmup_steps);
// Linear warmup to peak, then cosine decay to final_fraction * peak at total_steps, flat after.
Schedule warmup_cosine(double peak, int64_t warmup_steps, int64_t total_steps, double final_fraction = 0.0);
// Linear warmup to peak, then peak * max(min_fraction, decay_rate^((step - warmup_steps) / decay_steps)).
Schedule warmup_exponential(double peak, int64_t warmup_steps, int64_t decay_steps, double decay_rate,
                            double min_fraction = 0.0);
// Linear warmup to peak, then peak * sqrt(warmup_steps / step) (inverse square root decay).
// With warmup_steps = 0: peak / sqrt(step).
Schedule rsqrt(double peak, int64_t warmup_steps);

// ---- parameter filters (e.g. which params get weight decay) ---------------------------------
// Called with a param's path (empty when the caller passed none) and type.
using ParamFilter = std::function<bool(const std::string& path, const TensorType& type)>;
ParamFilter all_params();
// True for params of rank >= r: rank_at_least(2) decays matrices but not biases or norm scales.
ParamFilter rank_at_least(int r);
// False for paths that match any glob (px::glob_match: '*' any run of characters, '?' one), e.g.
// {"*.b", "*.scale"}.
ParamFilter exclude_paths(std::vector<std::string> globs);

// ---- optimizers ---------------------------------------------------------------------------

// One optimizer-state tensor: which param it belongs to, its role ("m", "v", "v_row", ...) and
// its type. Sharding can give a slot the spec of its param when their shapes agree.
struct StateSlot {
  int param = 0;
  std::string name;
  TensorType type;
};

struct Update {
  std::vector<Tensor> params;  // new params, same types as the old ones
  std::vector<Tensor> state;   // new state, same types as state_slots()
  Tensor lr;                   // the learning rate used (scalar f32), for metrics
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string name() const = 0;
  // The state, flat and in order, for params of these types. Float params get f32 state.
  virtual std::vector<StateSlot> state_slots(const std::vector<TensorType>& params) const = 0;
  std::vector<TensorType> state_types(const std::vector<TensorType>& params) const;
  // Initial state on the host (zeros for every optimizer here).
  virtual std::vector<Array> init_state(const std::vector<Array>& params) const;
  // Emits the update into the params' graph. `step` is a scalar i32 or f32 tensor holding the
  // 1-based number of this update; `paths` (optional) name the params for ParamFilters.
  // Params may be f32, bf16 or f16: the update is computed in f32 and cast back.
  Update apply(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& state,
               const Tensor& step, const std::vector<std::string>& paths = {}) const;
  // The host value of the base learning rate at `step` (as apply() would use it).
  virtual double lr_at(int64_t step) const = 0;

 protected:
  virtual Update apply_checked(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                               const std::vector<Tensor>& state, const Tensor& step,
                               const std::vector<std::string>& paths) const = 0;
};
using OptimizerPtr = std::shared_ptr<const Optimizer>;

// PyTorch-style SGD: g += weight_decay * p (L2, for params the mask selects); with momentum
// b = momentum * b + g and g = nesterov ? g + momentum * b : b; then p -= lr * g.
struct SgdOptions {
  Schedule lr = 1e-2;
  double momentum = 0.0;  // 0: no state
  bool nesterov = false;
  double weight_decay = 0.0;
  ParamFilter decay_mask;  // null: all params
};
OptimizerPtr sgd(SgdOptions opt = {});

// AdamW (Loshchilov & Hutter): m, v moments with bias correction and decoupled weight decay:
// p -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * p).
struct AdamWOptions {
  Schedule lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
  ParamFilter decay_mask;  // null: all params
};
OptimizerPtr adamw(AdamWOptions opt = {});
inline OptimizerPtr adam(AdamWOptions opt = {}) {
  opt.weight_decay = 0.0;
  return adamw(std::move(opt));
}

// Adafactor (Shazeer & Stern 2018). Second moments of params of rank >= 2 are factored over
// the last two dims (row and column means); rank < 2 params keep a full second moment.
//   beta2_t = 1 - step^(-decay_rate);  V = beta2_t V + (1 - beta2_t)(g^2 + eps1)
//   U = g / sqrt(V_hat);  U /= max(1, RMS(U) / clip_threshold)
//   alpha = rho_t * (scale_parameter ? max(eps2, RMS(p)) : 1)
//   rho_t = relative_step ? min(1e-2, 1/sqrt(step)) : lr(step)
//   optional momentum: M = beta1 M + (1 - beta1) U, U = M
//   p -= alpha * U + alpha * weight_decay * p
struct AdafactorOptions {
  Schedule lr = 1e-2;  // used when relative_step is false
  bool relative_step = true;
  bool scale_parameter = true;
  double decay_rate = 0.8;
  std::optional<double> beta1;  // none: no first moment (the paper's default)
  double eps1 = 1e-30;
  double eps2 = 1e-3;
  double clip_threshold = 1.0;
  double weight_decay = 0.0;
  ParamFilter decay_mask;              // null: all params
  int64_t min_dim_size_to_factor = 0;  // factor only when both of the last two dims are >= this
};
OptimizerPtr adafactor(AdafactorOptions opt = {});

// ---- clipping -------------------------------------------------------------------------------

// sqrt of the sum of squares of every element of every tensor, as a scalar f32.
Tensor global_norm(const std::vector<Tensor>& xs);

struct Clipped {
  std::vector<Tensor> grads;  // same types as the input grads
  Tensor norm;                // the global norm before clipping (scalar f32)
};
// Scales all grads by min(1, max_norm / norm) so that their global norm is at most max_norm.
Clipped clip_by_global_norm(const std::vector<Tensor>& grads, double max_norm);

}  // namespace px::optim
