// Helpers shared by the optimizer, schedule and clipping files (internal).
#pragma once

#include <string>
#include <vector>

#include "parallax/ops.h"
#include "parallax/optim.h"

namespace px::optim::detail {

inline Tensor scalar(double v) { return full({}, v, DType::f32); }
inline Tensor to_f32(const Tensor& x) { return x.dtype() == DType::f32 ? x : cast(x, DType::f32); }
inline Tensor to_dtype(const Tensor& x, DType d) { return x.dtype() == d ? x : cast(x, d); }

// The step as a scalar f32; throws "[op] step must be ..." for anything but a 1-element i32/f32.
Tensor step_f32(const Tensor& step, const char* op);

// 1 - b^t for a scalar f32 t, accurate when b^t is close to 1 (early bias corrections).
Tensor one_minus_pow(double b, const Tensor& t);

// Root mean square of all elements (f32 scalar).
Tensor rms(const Tensor& x32);

std::string fmt_double(double v);  // shortest round-trip text

// "param 2 ('blocks.0.w')" for messages; the path part only when paths were given.
std::string param_label(int i, const std::vector<std::string>& paths);
// Throws "[op] param i has type ..." for a non-float param.
void check_float_params(const std::string& op, const std::vector<TensorType>& params);
// Whether param i gets weight decay: weight_decay != 0 and the mask (null = all) selects it.
bool decays(double weight_decay, const ParamFilter& mask, int i, const std::vector<std::string>& paths,
            const TensorType& t);

}  // namespace px::optim::detail
