// Adafactor (Shazeer & Stern 2018, "Adafactor: Adaptive Learning Rates with Sublinear Memory
// Cost", Algorithms 4 and 5): factored second moments, update clipping, relative step size.
#include <cmath>

#include "optim/common.h"

namespace px::optim {

using detail::scalar;
using detail::to_dtype;
using detail::to_f32;

namespace {

class Adafactor : public Optimizer {
 public:
  explicit Adafactor(AdafactorOptions o) : o_(std::move(o)) {
    auto bad = [](const std::string& what) { throw Error("[adafactor] " + what); };
    if (!(o_.decay_rate > 0) || !std::isfinite(o_.decay_rate))
      bad("decay_rate must be a finite number > 0, got " + detail::fmt_double(o_.decay_rate));
    if (o_.beta1 && !(*o_.beta1 >= 0 && *o_.beta1 < 1))
      bad("beta1 must be in [0, 1), got " + detail::fmt_double(*o_.beta1));
    if (!(o_.eps1 >= 0) || !(o_.eps2 >= 0) || !std::isfinite(o_.eps1) || !std::isfinite(o_.eps2))
      bad("eps1 and eps2 must be finite numbers >= 0");
    if (!(o_.clip_threshold > 0) || !std::isfinite(o_.clip_threshold))
      bad("clip_threshold must be a finite number > 0, got " + detail::fmt_double(o_.clip_threshold));
    if (!std::isfinite(o_.weight_decay)) bad("weight_decay must be finite");
  }
  std::string name() const override { return "adafactor"; }
  double lr_at(int64_t step) const override {
    if (!o_.relative_step) return o_.lr.at(step);
    return std::min(1e-2, 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(step, 1))));
  }

  bool factored(const Shape& s) const {
    size_t r = s.size();
    return r >= 2 && s[r - 1] >= o_.min_dim_size_to_factor && s[r - 2] >= o_.min_dim_size_to_factor;
  }

  std::vector<StateSlot> state_slots(const std::vector<TensorType>& params) const override {
    detail::check_float_params(name(), params);
    std::vector<StateSlot> s;
    for (size_t i = 0; i < params.size(); ++i) {
      const Shape& sh = params[i].shape;
      int pi = static_cast<int>(i);
      if (factored(sh)) {
        Shape row(sh.begin(), sh.end() - 1);  // mean over the last dim
        Shape col(sh.begin(), sh.end() - 2);  // mean over the second-to-last dim
        col.push_back(sh.back());
        s.push_back({pi, "v_row", {DType::f32, row}});
        s.push_back({pi, "v_col", {DType::f32, col}});
      } else {
        s.push_back({pi, "v", {DType::f32, sh}});
      }
      if (o_.beta1) s.push_back({pi, "m", {DType::f32, sh}});
    }
    return s;
  }

 protected:
  Update apply_checked(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& state, const Tensor& step,
                       const std::vector<std::string>& paths) const override {
    Tensor t = maximum(detail::step_f32(step, "adafactor"), scalar(1.0));
    Update u;
    u.lr = o_.relative_step ? minimum(scalar(1e-2), px::rsqrt(t)) : o_.lr.lr(step);
    // beta2_t = 1 - t^(-decay_rate): 0 at the first step, so V starts as g^2 without bias correction.
    Tensor beta2 = 1.0 - exp(log(t) * -o_.decay_rate);
    Tensor one_minus_beta2 = 1.0 - beta2;
    size_t k = 0;  // next state slot
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = to_f32(params[i]);
      Tensor g = to_f32(grads[i]);
      Tensor g2 = square(g) + o_.eps1;
      Tensor upd;
      const int r = p.rank();
      if (factored(p.shape())) {
        Tensor row = state[k++] * beta2 + mean(g2, {r - 1}) * one_minus_beta2;
        Tensor col = state[k++] * beta2 + mean(g2, {r - 2}) * one_minus_beta2;
        u.state.push_back(row);
        u.state.push_back(col);
        // V_hat = row col^T / mean(row): 1/sqrt(V_hat) = rsqrt(row / mean(row)) x rsqrt(col).
        Tensor row_factor = px::rsqrt(row / mean(row, {r - 2}, /*keepdims=*/true));
        Tensor col_factor = px::rsqrt(col);
        upd = g * expand_dims(row_factor, r - 1) * expand_dims(col_factor, r - 2);
      } else {
        Tensor v = state[k++] * beta2 + g2 * one_minus_beta2;
        u.state.push_back(v);
        upd = g * px::rsqrt(v);
      }
      upd = upd / maximum(detail::rms(upd) / o_.clip_threshold, scalar(1.0));
      Tensor alpha = o_.scale_parameter ? u.lr * maximum(detail::rms(p), scalar(o_.eps2)) : u.lr;
      if (o_.beta1) {
        Tensor m = state[k++] * *o_.beta1 + upd * (1.0 - *o_.beta1);
        u.state.push_back(m);
        upd = m;
      }
      Tensor np = p - upd * alpha;
      if (detail::decays(o_.weight_decay, o_.decay_mask, static_cast<int>(i), paths, params[i].type()))
        np = np - p * (alpha * o_.weight_decay);
      u.params.push_back(to_dtype(np, params[i].dtype()));
    }
    return u;
  }

 private:
  AdafactorOptions o_;
};

}  // namespace

OptimizerPtr adafactor(AdafactorOptions opt) { return std::make_shared<Adafactor>(std::move(opt)); }

}  // namespace px::optim
