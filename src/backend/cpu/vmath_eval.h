// The vector transcendentals of vmath.h as compiled into the library (with the library's target
// flags), for tests that check them against libm: vmath.h itself compiles to another width in a
// translation unit built with other flags.
#pragma once

#include <cstdint>
#include <string>

namespace px::cpu {

// y[i] = fn(x[i]) for fn one of "exp", "log", "tanh", "sigmoid", "erf", "erfc", "phi"; false for
// another name. Also the lane count the library was built with.
bool vecmath_eval(const std::string& fn, const float* x, float* y, int64_t n);
int vecmath_lanes();

}  // namespace px::cpu
