// Runs an optimizer's traced update step by step, for comparison with double-precision references.
#pragma once

#include "parallax/optim.h"
#include "testing.h"

namespace px::optim::testing {

using px::testing::all_close;
using px::testing::random_array;

inline std::vector<double> to_double(const Array& a) {
  std::vector<float> f = a.to_f32();
  return std::vector<double>(f.begin(), f.end());
}
inline std::vector<float> to_float(const std::vector<double>& d) { return std::vector<float>(d.begin(), d.end()); }

// Compiles params, grads, state, step -> new params, new state, lr once and applies it repeatedly.
class Stepper {
 public:
  Stepper(OptimizerPtr opt, std::vector<Array> params, std::vector<std::string> paths = {},
          DType step_dtype = DType::i32)
      : opt_(std::move(opt)), params_(std::move(params)), step_dtype_(step_dtype) {
    state_ = opt_->init_state(params_);
    const size_t np = params_.size(), ns = state_.size();
    std::vector<TensorType> types;
    for (auto& p : params_) types.push_back(p.type());
    for (auto& p : params_) types.push_back({DType::f32, p.shape()});  // grads in f32
    for (auto& s : state_) types.push_back(s.type());
    types.push_back({step_dtype, {}});
    auto g = trace(
        [&](const std::vector<Tensor>& in) {
          std::vector<Tensor> p(in.begin(), in.begin() + np), gr(in.begin() + np, in.begin() + 2 * np),
              s(in.begin() + 2 * np, in.begin() + 2 * np + ns);
          Update u = opt_->apply(p, gr, s, in.back(), paths);
          std::vector<Tensor> out = u.params;
          out.insert(out.end(), u.state.begin(), u.state.end());
          out.push_back(u.lr);
          return out;
        },
        types);
    exe_ = Executable::compile(*g);
  }

  // Applies update number `step` (1-based) with these grads; returns the learning rate used.
  double step(const std::vector<Array>& grads, int64_t step) {
    std::vector<Array> in = params_;
    in.insert(in.end(), grads.begin(), grads.end());
    in.insert(in.end(), state_.begin(), state_.end());
    in.push_back(step_dtype_ == DType::i32 ? Array::from_i32({static_cast<int32_t>(step)}, {})
                                           : Array::scalar(static_cast<float>(step)));
    std::vector<Array> out = exe_->run(in);
    for (size_t i = 0; i < params_.size(); ++i) params_[i] = out[i];
    for (size_t i = 0; i < state_.size(); ++i) state_[i] = out[params_.size() + i];
    return out.back().to_f32()[0];
  }

  const std::vector<Array>& params() const { return params_; }
  const std::vector<Array>& state() const { return state_; }

 private:
  OptimizerPtr opt_;
  std::vector<Array> params_, state_;
  DType step_dtype_;
  std::unique_ptr<Executable> exe_;
};

}  // namespace px::optim::testing
