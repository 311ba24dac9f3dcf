// Public constants, elementwise functions and operators: numpy-style broadcasting (by inserting
// broadcast_in_dim), dtype checks, and scalars that adopt the tensor's dtype.
#include <cmath>
#include <sstream>

#include "ir/primitive.h"
#include "parallax/ops.h"

namespace px {

namespace {

void check_defined(const char* op, const Tensor& t, const char* which) {
  if (!t.defined()) throw Error(std::string("[") + op + "] " + which + " is an undefined tensor");
}

// The numpy broadcast of two shapes (trailing alignment); the error names both.
Shape broadcast_shapes(const char* op, const TensorType& a, const TensorType& b) {
  size_t r = std::max(a.shape.size(), b.shape.size());
  Shape s(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t da = i < r - a.shape.size() ? 1 : a.shape[i - (r - a.shape.size())];
    int64_t db = i < r - b.shape.size() ? 1 : b.shape[i - (r - b.shape.size())];
    if (da != db && da != 1 && db != 1)
      throw Error(std::string("[") + op + "] cannot broadcast " + type_str(a) + " with " + type_str(b) + ": dim " +
                  std::to_string(static_cast<int64_t>(i) - static_cast<int64_t>(r)) + " is " + std::to_string(da) +
                  " vs " + std::to_string(db) + " (sizes must match or be 1)");
    s[i] = da == 1 ? db : da;
  }
  return s;
}

Tensor broadcast_as(const Tensor& x, const Shape& shape) { return x.shape() == shape ? x : broadcast_to(x, shape); }

Tensor binary(const char* op, const char* prim, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "lhs");
  check_defined(op, b, "rhs");
  if (a.dtype() != b.dtype())
    throw Error(std::string("[") + op + "] operand dtypes differ: lhs " + type_str(a.type()) + ", rhs " +
                type_str(b.type()) + "; convert one with px::cast(x, DType::" + dtype_name(a.dtype()) + ")");
  Shape s = broadcast_shapes(op, a.type(), b.type());
  return emit1(prim, {broadcast_as(a, s), broadcast_as(b, s)});
}

Tensor unary(const char* op, const char* prim, const Tensor& x) {
  check_defined(op, x, "the operand");
  return emit1(prim, {x});
}

// A scalar operand takes the tensor's dtype; a fractional scalar cannot silently truncate.
Tensor scalar_like(const char* op, const Tensor& t, double v) {
  check_defined(op, t, "the tensor operand");
  if (t.dtype() == DType::i32 && v != std::trunc(v)) {
    std::ostringstream os;
    os << "[" << op << "] the scalar " << v << " is not an integer but the tensor is " << type_str(t.type())
       << "; cast the tensor with px::cast(x, DType::f32) first";
    throw Error(os.str());
  }
  return full(t.shape(), v, t.dtype());
}

}  // namespace

// ---- constants ------------------------------------------------------------------------------

Tensor constant(const Array& value) {
  if (!value.defined()) throw Error("[constant] the array is undefined (default-constructed)");
  // A private copy: later writes to the caller's buffer must not change the graph.
  return emit1("constant", {}, {{"value", std::make_shared<const Array>(value.clone())}});
}

Tensor full(const Shape& shape, double value, DType dtype) {
  return emit1("full", {}, {{"shape", shape}, {"value", value}, {"dtype", dtype}});
}

Tensor full_like(const Tensor& x, double value) {
  check_defined("full_like", x, "the operand");
  return full(x.shape(), value, x.dtype());
}
Tensor zeros_like(const Tensor& x) { return full_like(x, 0.0); }
Tensor ones_like(const Tensor& x) { return full_like(x, 1.0); }

Tensor iota(const Shape& shape, int axis, DType dtype) {
  int a = normalize_axis(axis, static_cast<int>(shape.size()), "iota");
  return emit1("iota", {}, {{"shape", shape}, {"axis", static_cast<int64_t>(a)}, {"dtype", dtype}});
}

// ---- broadcasting ---------------------------------------------------------------------------

Tensor broadcast_to(const Tensor& x, const Shape& shape) {
  check_defined("broadcast_to", x, "the operand");
  if (x.shape() == shape) return x;
  size_t r = shape.size(), k = x.shape().size();
  if (k > r)
    throw Error("[broadcast_to] cannot broadcast " + type_str(x.type()) + " to " + shape_str(shape) +
                ": the target has fewer dims");
  std::vector<int64_t> dims;
  for (size_t i = 0; i < k; ++i) {
    int64_t d = x.shape()[i], want = shape[r - k + i];
    if (d != 1 && d != want)
      throw Error("[broadcast_to] cannot broadcast " + type_str(x.type()) + " to " + shape_str(shape) + ": dim " +
                  std::to_string(i) + " is " + std::to_string(d) + " vs " + std::to_string(want) +
                  " (sizes must match or be 1)");
    dims.push_back(static_cast<int64_t>(r - k + i));
  }
  return emit1("broadcast_in_dim", {x}, {{"shape", shape}, {"dims", dims}});
}

Tensor broadcast_in_dim(const Tensor& x, const Shape& shape, const std::vector<int64_t>& dims) {
  check_defined("broadcast_in_dim", x, "the operand");
  bool identity = x.shape() == shape;
  for (size_t i = 0; i < dims.size() && identity; ++i) identity = dims[i] == static_cast<int64_t>(i);
  if (identity && dims.size() == shape.size()) return x;
  return emit1("broadcast_in_dim", {x}, {{"shape", shape}, {"dims", dims}});
}

// ---- elementwise ----------------------------------------------------------------------------

Tensor add(const Tensor& a, const Tensor& b) { return binary("add", "add", a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary("sub", "sub", a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary("mul", "mul", a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary("div", "div", a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return binary("pow", "pow", a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary("maximum", "maximum", a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary("minimum", "minimum", a, b); }
Tensor neg(const Tensor& x) { return unary("neg", "neg", x); }
Tensor exp(const Tensor& x) { return unary("exp", "exp", x); }
Tensor log(const Tensor& x) { return unary("log", "log", x); }
Tensor tanh(const Tensor& x) { return unary("tanh", "tanh", x); }
Tensor sqrt(const Tensor& x) { return unary("sqrt", "sqrt", x); }
Tensor rsqrt(const Tensor& x) { return unary("rsqrt", "rsqrt", x); }
Tensor abs(const Tensor& x) { return unary("abs", "abs", x); }
Tensor square(const Tensor& x) {
  check_defined("square", x, "the operand");
  return emit1("mul", {x, x});
}
Tensor sigmoid(const Tensor& x) { return unary("sigmoid", "sigmoid", x); }

Tensor equal(const Tensor& a, const Tensor& b) { return binary("equal", "eq", a, b); }
Tensor not_equal(const Tensor& a, const Tensor& b) { return binary("not_equal", "ne", a, b); }
Tensor less(const Tensor& a, const Tensor& b) { return binary("less", "lt", a, b); }
Tensor less_equal(const Tensor& a, const Tensor& b) { return binary("less_equal", "le", a, b); }
Tensor greater(const Tensor& a, const Tensor& b) { return binary("greater", "gt", a, b); }
Tensor greater_equal(const Tensor& a, const Tensor& b) { return binary("greater_equal", "ge", a, b); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return binary("logical_and", "logical_and", a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return binary("logical_or", "logical_or", a, b); }
Tensor logical_not(const Tensor& x) { return unary("logical_not", "logical_not", x); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  check_defined("where", cond, "the condition");
  check_defined("where", a, "the true branch");
  check_defined("where", b, "the false branch");
  if (cond.dtype() != DType::boolean)
    throw Error("[where] the condition must be bool, got " + type_str(cond.type()) +
                "; build it with a comparison such as px::greater");
  if (a.dtype() != b.dtype())
    throw Error("[where] the branches have different dtypes: " + type_str(a.type()) + " and " + type_str(b.type()) +
                "; convert one with px::cast(x, DType::" + dtype_name(a.dtype()) + ")");
  Shape s = broadcast_shapes("where", a.type(), b.type());
  s = broadcast_shapes("where", cond.type(), TensorType{a.dtype(), s});
  return emit1("select", {broadcast_as(cond, s), broadcast_as(a, s), broadcast_as(b, s)});
}

Tensor cast(const Tensor& x, DType dtype) {
  check_defined("cast", x, "the operand");
  if (x.dtype() == dtype) return x;
  return emit1("cast", {x}, {{"dtype", dtype}});
}

Tensor stop_gradient(const Tensor& x) { return unary("stop_gradient", "stop_gradient", x); }

Tensor tag(const Tensor& x, const std::string& name) {
  check_defined("tag", x, "the operand");
  Tensor t = emit1("tag", {x}, {{"name", name}});
  // The node name is what remat policies and graph dumps look for.
  t.graph()->mutable_nodes().back().name = name;
  return t;
}

// ---- operators ------------------------------------------------------------------------------

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator-(const Tensor& x) { return neg(x); }
Tensor operator+(const Tensor& a, double b) { return add(a, scalar_like("add", a, b)); }
Tensor operator-(const Tensor& a, double b) { return sub(a, scalar_like("sub", a, b)); }
Tensor operator*(const Tensor& a, double b) { return mul(a, scalar_like("mul", a, b)); }
Tensor operator/(const Tensor& a, double b) { return div(a, scalar_like("div", a, b)); }
Tensor operator+(double a, const Tensor& b) { return add(scalar_like("add", b, a), b); }
Tensor operator-(double a, const Tensor& b) { return sub(scalar_like("sub", b, a), b); }
Tensor operator*(double a, const Tensor& b) { return mul(scalar_like("mul", b, a), b); }
Tensor operator/(double a, const Tensor& b) { return div(scalar_like("div", b, a), b); }

}  // namespace px
