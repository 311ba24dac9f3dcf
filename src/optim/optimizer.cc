// The Optimizer base (argument checks, state init), parameter filters, SGD and AdamW.
#include <cmath>

#include "ir/primitive.h"
#include "optim/common.h"

namespace px::optim {

using detail::scalar;
using detail::to_dtype;
using detail::to_f32;

// ---- filters --------------------------------------------------------------------------------


ParamFilter all_params() {
  return [](const std::string&, const TensorType&) { return true; };
}
ParamFilter rank_at_least(int r) {
  return [r](const std::string&, const TensorType& t) { return t.rank() >= r; };
}
ParamFilter exclude_paths(std::vector<std::string> globs) {
  return [globs = std::move(globs)](const std::string& path, const TensorType&) {
    for (auto& g : globs)
      if (glob_match(g, path)) return false;
    return true;
  };
}

// ---- the base class -------------------------------------------------------------------------

std::vector<TensorType> Optimizer::state_types(const std::vector<TensorType>& params) const {
  std::vector<TensorType> t;
  for (auto& s : state_slots(params)) t.push_back(s.type);
  return t;
}

std::vector<Array> Optimizer::init_state(const std::vector<Array>& params) const {
  std::vector<TensorType> types;
  for (auto& p : params) types.push_back(p.type());
  std::vector<Array> state;
  for (auto& s : state_slots(types)) state.push_back(Array::zeros(s.type.dtype, s.type.shape));
  return state;
}

namespace detail {

std::string param_label(int i, const std::vector<std::string>& paths) {
  std::string s = "param " + std::to_string(i);
  if (i < static_cast<int>(paths.size()) && !paths[i].empty()) s += " ('" + paths[i] + "')";
  return s;
}

void check_float_params(const std::string& op, const std::vector<TensorType>& params) {
  for (size_t i = 0; i < params.size(); ++i)
    if (!is_float(params[i].dtype))
      throw Error("[" + op + "] param " + std::to_string(i) + " has type " + type_str(params[i]) +
                  "; optimizers update float params only");
}

bool decays(double weight_decay, const ParamFilter& mask, int i, const std::vector<std::string>& paths,
            const TensorType& t) {
  if (weight_decay == 0.0) return false;
  if (!mask) return true;
  return mask(i < static_cast<int>(paths.size()) ? paths[i] : std::string(), t);
}

}  // namespace detail

Update Optimizer::apply(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                        const std::vector<Tensor>& state, const Tensor& step,
                        const std::vector<std::string>& paths) const {
  const std::string op = name();
  auto fail = [&](const std::string& what) { throw Error("[" + op + "] " + what); };
  detail::step_f32(step, op.c_str());  // validates the step
  Graph* g = step.graph();
  if (grads.size() != params.size())
    fail(std::to_string(params.size()) + " params but " + std::to_string(grads.size()) + " grads");
  if (!paths.empty() && paths.size() != params.size())
    fail(std::to_string(params.size()) + " params but " + std::to_string(paths.size()) +
         " paths (pass none or one each)");
  std::vector<TensorType> types;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string what = detail::param_label(static_cast<int>(i), paths);
    if (!params[i].defined()) fail(what + " is an undefined tensor");
    if (!grads[i].defined()) fail("the grad of " + what + " is an undefined tensor");
    if (params[i].graph() != g || grads[i].graph() != g)
      fail("params, grads, state and step must belong to one graph (" + what + " does not)");
    if (grads[i].shape() != params[i].shape() || !is_float(grads[i].dtype()))
      fail("the grad of " + what + " has type " + type_str(grads[i].type()) + " but the param has type " +
           type_str(params[i].type()) + " (want a float grad of the same shape)");
    types.push_back(params[i].type());
  }
  std::vector<StateSlot> slots = state_slots(types);  // also rejects non-float params
  if (state.size() != slots.size())
    fail("got " + std::to_string(state.size()) + " state tensors but these params need " +
         std::to_string(slots.size()) + "; build them with init_state() or state_slots()");
  for (size_t k = 0; k < slots.size(); ++k) {
    if (!state[k].defined() || state[k].graph() != g)
      fail("state " + std::to_string(k) + " is undefined or belongs to another graph");
    if (state[k].type() != slots[k].type)
      fail("state " + std::to_string(k) + " ('" + slots[k].name + "' of " + detail::param_label(slots[k].param, paths) +
           ") has type " + type_str(state[k].type()) + " but " + type_str(slots[k].type) + " was expected");
  }
  TraceScope scope(g);
  return apply_checked(params, grads, state, step, paths);
}

// ---- SGD ----------------------------------------------------------------------------------

namespace {

class Sgd : public Optimizer {
 public:
  explicit Sgd(SgdOptions o) : o_(std::move(o)) {
    if (!(o_.momentum >= 0) || !std::isfinite(o_.momentum))
      throw Error("[sgd] momentum must be a finite number >= 0, got " + detail::fmt_double(o_.momentum));
    if (o_.nesterov && o_.momentum == 0) throw Error("[sgd] nesterov needs momentum > 0");
    if (!std::isfinite(o_.weight_decay))
      throw Error("[sgd] weight_decay must be finite, got " + detail::fmt_double(o_.weight_decay));
  }
  std::string name() const override { return "sgd"; }
  double lr_at(int64_t step) const override { return o_.lr.at(step); }
  std::vector<StateSlot> state_slots(const std::vector<TensorType>& params) const override {
    detail::check_float_params(name(), params);
    std::vector<StateSlot> s;
    if (o_.momentum > 0)
      for (size_t i = 0; i < params.size(); ++i)
        s.push_back({static_cast<int>(i), "momentum", {DType::f32, params[i].shape}});
    return s;
  }

 protected:
  Update apply_checked(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& state, const Tensor& step,
                       const std::vector<std::string>& paths) const override {
    Update u;
    u.lr = o_.lr.lr(step);
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = to_f32(params[i]);
      Tensor g = to_f32(grads[i]);
      if (detail::decays(o_.weight_decay, o_.decay_mask, static_cast<int>(i), paths, params[i].type()))
        g = g + p * o_.weight_decay;
      if (o_.momentum > 0) {
        Tensor b = state[i] * o_.momentum + g;
        u.state.push_back(b);
        g = o_.nesterov ? g + b * o_.momentum : b;
      }
      u.params.push_back(to_dtype(p - g * u.lr, params[i].dtype()));
    }
    return u;
  }

 private:
  SgdOptions o_;
};

// ---- AdamW --------------------------------------------------------------------------------

class AdamW : public Optimizer {
 public:
  explicit AdamW(AdamWOptions o) : o_(std::move(o)) {
    auto in01 = [](double b) { return b >= 0 && b < 1; };
    if (!in01(o_.beta1) || !in01(o_.beta2))
      throw Error("[adamw] beta1 and beta2 must be in [0, 1), got " + detail::fmt_double(o_.beta1) + " and " +
                  detail::fmt_double(o_.beta2));
    if (!(o_.eps >= 0) || !std::isfinite(o_.eps))
      throw Error("[adamw] eps must be a finite number >= 0, got " + detail::fmt_double(o_.eps));
    if (!std::isfinite(o_.weight_decay))
      throw Error("[adamw] weight_decay must be finite, got " + detail::fmt_double(o_.weight_decay));
  }
  std::string name() const override { return "adamw"; }
  double lr_at(int64_t step) const override { return o_.lr.at(step); }
  std::vector<StateSlot> state_slots(const std::vector<TensorType>& params) const override {
    detail::check_float_params(name(), params);
    std::vector<StateSlot> s;
    for (size_t i = 0; i < params.size(); ++i) {
      s.push_back({static_cast<int>(i), "m", {DType::f32, params[i].shape}});
      s.push_back({static_cast<int>(i), "v", {DType::f32, params[i].shape}});
    }
    return s;
  }

 protected:
  Update apply_checked(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& state, const Tensor& step,
                       const std::vector<std::string>& paths) const override {
    Update u;
    u.lr = o_.lr.lr(step);
    Tensor t = detail::step_f32(step, "adamw");
    // Bias corrections folded into two scalars: lr / (1 - b1^t) and 1 / sqrt(1 - b2^t).
    Tensor step_size = u.lr / (o_.beta1 > 0 ? detail::one_minus_pow(o_.beta1, t) : scalar(1.0));
    Tensor inv_sqrt_bc2 = o_.beta2 > 0 ? px::rsqrt(detail::one_minus_pow(o_.beta2, t)) : scalar(1.0);
    // One adamw_update per param (src/ops/optim.cc): a single pass over p, g, m and v computing
    //   m' = m b1 + g (1 - b1),  v' = v b2 + g^2 (1 - b2),
    //   p' = p - m' step_size / (sqrt(v') inv_sqrt_bc2 + eps) - p lr weight_decay   (in f32).
    auto f32_scalar = [](const Tensor& x) { return to_f32(x.rank() == 0 ? x : reshape(x, {})); };
    step_size = f32_scalar(step_size);
    inv_sqrt_bc2 = f32_scalar(inv_sqrt_bc2);
    Tensor decay = f32_scalar(u.lr * o_.weight_decay);
    for (size_t i = 0; i < params.size(); ++i) {
      const bool decays =
          detail::decays(o_.weight_decay, o_.decay_mask, static_cast<int>(i), paths, params[i].type());
      std::vector<Tensor> in{params[i], grads[i], state[2 * i], state[2 * i + 1], step_size, inv_sqrt_bc2};
      if (decays) in.push_back(decay);
      std::vector<Tensor> r = emit("adamw_update", in,
                                   {{"beta1", o_.beta1}, {"beta2", o_.beta2}, {"eps", o_.eps}, {"decay", int64_t{decays}}});
      u.params.push_back(r[0]);
      u.state.push_back(r[1]);
      u.state.push_back(r[2]);
    }
    return u;
  }

 private:
  AdamWOptions o_;
};

}  // namespace

OptimizerPtr sgd(SgdOptions opt) { return std::make_shared<Sgd>(std::move(opt)); }
OptimizerPtr adamw(AdamWOptions opt) { return std::make_shared<AdamW>(std::move(opt)); }

}  // namespace px::optim
