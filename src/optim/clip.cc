// Global-norm gradient clipping.
#include <cmath>

#include "optim/common.h"

namespace px::optim {

namespace {
void check_list(const std::vector<Tensor>& xs, const char* op) {
  Graph* g = nullptr;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (!xs[i].defined()) throw Error(std::string("[") + op + "] tensor " + std::to_string(i) + " is undefined");
    if (!is_float(xs[i].dtype()))
      throw Error(std::string("[") + op + "] tensor " + std::to_string(i) + " has type " + type_str(xs[i].type()) +
                  "; only float tensors have a norm");
    if (g && xs[i].graph() != g) throw Error(std::string("[") + op + "] the tensors belong to different graphs");
    g = xs[i].graph();
  }
}

Tensor norm_of(const std::vector<Tensor>& xs) {
  Tensor total;
  for (auto& x : xs) {
    Tensor s = sum(square(detail::to_f32(x)));
    total = total.defined() ? total + s : s;
  }
  return total.defined() ? sqrt(total) : detail::scalar(0.0);
}
}  // namespace

Tensor global_norm(const std::vector<Tensor>& xs) {
  check_list(xs, "global_norm");
  if (xs.empty()) return detail::scalar(0.0);  // into current_graph()
  TraceScope scope(xs[0].graph());
  return norm_of(xs);
}

Clipped clip_by_global_norm(const std::vector<Tensor>& grads, double max_norm) {
  check_list(grads, "clip_by_global_norm");
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    throw Error("[clip_by_global_norm] max_norm must be a finite number > 0, got " + detail::fmt_double(max_norm));
  Clipped c;
  if (grads.empty()) {
    c.norm = detail::scalar(0.0);
    return c;
  }
  TraceScope scope(grads[0].graph());
  c.norm = norm_of(grads);
  // min(1, max_norm / norm); the comparison is false for a NaN norm, which then reaches the grads.
  Tensor scale = where(less_equal(c.norm, detail::scalar(max_norm)), detail::scalar(1.0), max_norm / c.norm);
  for (auto& g : grads) c.grads.push_back(detail::to_dtype(detail::to_f32(g) * scale, g.dtype()));
  return c;
}

}  // namespace px::optim
