// vecmath_eval: vmath.h's functions as the library compiles them (see vmath_eval.h).
#include "backend/cpu/vmath.h"

#include "backend/cpu/vmath_eval.h"

namespace px::cpu {

bool vecmath_eval(const std::string& fn, const float* x, float* y, int64_t n) {
  using vecmath::V;
  if (fn == "exp") return vecmath::map(x, y, n, [](V v) { return vecmath::exp(v); }), true;
  if (fn == "log") return vecmath::map(x, y, n, [](V v) { return vecmath::log(v); }), true;
  if (fn == "tanh") return vecmath::map(x, y, n, [](V v) { return vecmath::tanh(v); }), true;
  if (fn == "sigmoid") return vecmath::map(x, y, n, [](V v) { return vecmath::sigmoid(v); }), true;
  if (fn == "erf") return vecmath::map(x, y, n, [](V v) { return vecmath::erf(v); }), true;
  if (fn == "erfc") return vecmath::map(x, y, n, [](V v) { return vecmath::erfc(v); }), true;
  if (fn == "phi") return vecmath::map(x, y, n, [](V v) { return vecmath::phi(v); }), true;
  return false;
}

int vecmath_lanes() { return vecmath::kLanes; }

}  // namespace px::cpu
