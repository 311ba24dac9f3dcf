// Learning-rate schedules: each gives a host value in double precision and the same formula as
// traced f32 ops, so a compiled step and the trainer's logs agree.
#include <charconv>
#include <cmath>

#include "optim/common.h"

namespace px::optim {

namespace detail {

std::string fmt_double(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

Tensor step_f32(const Tensor& step, const char* op) {
  if (!step.defined()) throw Error(std::string("[") + op + "] step is an undefined tensor");
  if (step.numel() != 1 || (step.dtype() != DType::i32 && step.dtype() != DType::f32))
    throw Error(std::string("[") + op + "] step must be a scalar i32 or f32 (the 1-based update number), got " +
                type_str(step.type()));
  Tensor s = step.rank() == 0 ? step : reshape(step, {});
  return to_f32(s);
}

Tensor one_minus_pow(double b, const Tensor& t) {
  // 1 - b^t = -expm1(x) with x = t ln b; a short series avoids cancellation for small |x|.
  Tensor x = t * std::log(b);
  Tensor series = -(x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0))))));
  Tensor direct = 1.0 - exp(x);
  return where(less(abs(x), scalar(1e-2)), series, direct);
}

Tensor rms(const Tensor& x32) { return sqrt(mean(square(x32))); }

}  // namespace detail

namespace {

using detail::fmt_double;
using detail::scalar;

void check_finite(double v, const char* op, const char* what) {
  if (!std::isfinite(v)) throw Error(std::string("[") + op + "] " + what + " must be finite, got " + fmt_double(v));
}
// A learning rate below 0 would climb the loss: almost always a sign slip, so it is an error.
void check_lr(double v, const char* op, const char* what) {
  check_finite(v, op, what);
  if (v < 0)
    throw UserError(std::string("[") + op + "] " + what + " is a learning rate and must be >= 0, got " +
                    fmt_double(v));
}
void check_nonneg(int64_t v, const char* op, const char* what) {
  if (v < 0) throw Error(std::string("[") + op + "] " + what + " must be >= 0, got " + std::to_string(v));
}

// Graph of the step tensor for the constants a schedule emits.
struct StepScope {
  explicit StepScope(const Tensor& step) : scope(step.graph()) {}
  TraceScope scope;
};

// sin(x) for |x| <= pi/4 as a Taylor polynomial to x^11 (error < 1e-11): the op set has no sine.
Tensor small_sin(const Tensor& x) {
  const double c[] = {1.0, -1.0 / 6, 1.0 / 120, -1.0 / 5040, 1.0 / 362880, -1.0 / 39916800};
  Tensor x2 = x * x;
  Tensor poly = scalar(c[5]);
  for (int k = 4; k >= 0; --k) poly = poly * x2 + c[k];
  return x * poly;
}

// 0.5 * (1 + cos(pi p)) for p in [0, 1], as 1 - sin^2(pi p / 2) below p = 1/2 and sin^2(pi (1 - p) / 2)
// above, so that the value is accurate relative to itself near 0 (it ends at exactly 0).
Tensor half_cosine(const Tensor& p) {
  Tensor lo = small_sin(minimum(p, scalar(0.5)) * (M_PI / 2));
  Tensor hi = small_sin((1.0 - maximum(p, scalar(0.5))) * (M_PI / 2));
  return where(less_equal(p, scalar(0.5)), 1.0 - lo * lo, hi * hi);
}
double half_cosine(double p) { return 0.5 * (1.0 + std::cos(M_PI * p)); }

class Constant : public ScheduleImpl {
 public:
  explicit Constant(double v) : v_(v) { check_lr(v, "constant", "value"); }
  double at(int64_t) const override { return v_; }
  Tensor lr(const Tensor& step) const override {
    detail::step_f32(step, "constant");
    StepScope s(step);
    return scalar(v_);
  }
  std::string describe() const override { return "constant(" + fmt_double(v_) + ")"; }

 private:
  double v_;
};

// Shared by the warmup schedules: peak * step / warmup below warmup_steps.
class Warmup : public ScheduleImpl {
 public:
  Warmup(const char* op, double peak, int64_t warmup) : op_(op), peak_(peak), warmup_(warmup) {
    check_lr(peak, op, "peak");
    check_nonneg(warmup, op, "warmup_steps");
  }
  double at(int64_t step) const override {
    double t = static_cast<double>(step);
    if (t < warmup_) return peak_ * t / warmup_;
    return after(t);
  }
  Tensor lr(const Tensor& step) const override {
    Tensor t = detail::step_f32(step, op_);
    StepScope s(step);
    Tensor post = after(t);
    if (warmup_ == 0) return post;
    return where(less(t, scalar(static_cast<double>(warmup_))), t * (peak_ / warmup_), post);
  }

 protected:
  virtual double after(double t) const = 0;
  virtual Tensor after(const Tensor& t) const = 0;
  std::string head() const {
    return std::string(op_) + "(peak=" + fmt_double(peak_) + ", warmup_steps=" + std::to_string(warmup_);
  }

  const char* op_;
  double peak_;
  int64_t warmup_;
};

class LinearWarmup : public Warmup {
 public:
  LinearWarmup(double peak, int64_t warmup) : Warmup("linear_warmup", peak, warmup) {}
  std::string describe() const override { return head() + ")"; }

 protected:
  double after(double) const override { return peak_; }
  Tensor after(const Tensor&) const override { return scalar(peak_); }
};

class WarmupCosine : public Warmup {
 public:
  WarmupCosine(double peak, int64_t warmup, int64_t total, double final_fraction)
      : Warmup("warmup_cosine", peak, warmup), total_(total), final_(final_fraction) {
    check_finite(final_fraction, op_, "final_fraction");
    if (final_fraction < 0)
      throw Error("[warmup_cosine] final_fraction must be >= 0, got " + fmt_double(final_fraction));
    if (total <= warmup)
      throw Error("[warmup_cosine] total_steps (" + std::to_string(total) + ") must exceed warmup_steps (" +
                  std::to_string(warmup) + ")");
  }
  std::string describe() const override {
    return head() + ", total_steps=" + std::to_string(total_) + ", final_fraction=" + fmt_double(final_) + ")";
  }

 protected:
  double span() const { return static_cast<double>(total_ - warmup_); }
  double after(double t) const override {
    double p = std::min(1.0, std::max(0.0, (t - warmup_) / span()));
    return peak_ * (final_ + (1.0 - final_) * half_cosine(p));
  }
  Tensor after(const Tensor& t) const override {
    Tensor p = minimum(maximum((t - static_cast<double>(warmup_)) / span(), scalar(0.0)), scalar(1.0));
    return (half_cosine(p) * (1.0 - final_) + final_) * peak_;
  }

 private:
  int64_t total_;
  double final_;
};

class WarmupExponential : public Warmup {
 public:
  WarmupExponential(double peak, int64_t warmup, int64_t decay_steps, double rate, double min_fraction)
      : Warmup("warmup_exponential", peak, warmup), decay_steps_(decay_steps), rate_(rate), min_(min_fraction) {
    if (decay_steps <= 0)
      throw Error("[warmup_exponential] decay_steps must be > 0, got " + std::to_string(decay_steps));
    if (!(rate > 0) || !std::isfinite(rate))
      throw Error("[warmup_exponential] decay_rate must be a finite number > 0, got " + fmt_double(rate));
    check_finite(min_fraction, op_, "min_fraction");
  }
  std::string describe() const override {
    return head() + ", decay_steps=" + std::to_string(decay_steps_) + ", decay_rate=" + fmt_double(rate_) +
           ", min_fraction=" + fmt_double(min_) + ")";
  }

 protected:
  double after(double t) const override {
    return peak_ * std::max(min_, std::pow(rate_, (t - warmup_) / static_cast<double>(decay_steps_)));
  }
  Tensor after(const Tensor& t) const override {
    Tensor e = (t - static_cast<double>(warmup_)) * (std::log(rate_) / static_cast<double>(decay_steps_));
    return maximum(exp(e), scalar(min_)) * peak_;
  }

 private:
  int64_t decay_steps_;
  double rate_, min_;
};

class Rsqrt : public Warmup {
 public:
  Rsqrt(double peak, int64_t warmup) : Warmup("rsqrt", peak, warmup) {}
  std::string describe() const override { return head() + ")"; }

 protected:
  // Steps below 1 are clamped so that step 0 gives peak instead of infinity.
  double w() const { return warmup_ > 0 ? static_cast<double>(warmup_) : 1.0; }
  double after(double t) const override { return peak_ * std::sqrt(w() / std::max(t, w())); }
  Tensor after(const Tensor& t) const override { return px::rsqrt(maximum(t, scalar(w())) / w()) * peak_; }
};

}  // namespace

Schedule::Schedule(double constant_value) : impl_(std::make_shared<Constant>(constant_value)) {}

Tensor Schedule::lr(const Tensor& step) const { return impl_->lr(step); }

Schedule constant(double value) { return Schedule(value); }
Schedule linear_warmup(double peak, int64_t warmup_steps) {
  return Schedule(std::make_shared<LinearWarmup>(peak, warmup_steps));
}
Schedule warmup_cosine(double peak, int64_t warmup_steps, int64_t total_steps, double final_fraction) {
  return Schedule(std::make_shared<WarmupCosine>(peak, warmup_steps, total_steps, final_fraction));
}
Schedule warmup_exponential(double peak, int64_t warmup_steps, int64_t decay_steps, double decay_rate,
                            double min_fraction) {
  return Schedule(std::make_shared<WarmupExponential>(peak, warmup_steps, decay_steps, decay_rate, min_fraction));
}
Schedule rsqrt(double peak, int64_t warmup_steps) { return Schedule(std::make_shared<Rsqrt>(peak, warmup_steps)); }

}  // namespace px::optim
