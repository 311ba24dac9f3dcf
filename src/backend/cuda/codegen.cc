// The kernel generator's common parts and its elementwise kernels (single nodes and fused groups).
// The row, index, optimizer and random kernels are in codegen_rows.cc.
//
// An elementwise kernel is a grid-stride loop over the unit's elements: each thread loads its
// element of every operand (a broadcast_in_dim of an operand is a load at the strided index it
// reads), computes the group's nodes in order in registers, and stores the results the unit
// writes. Registers hold float values in f32 (a bf16 or f16 value rounded to its dtype after
// every node, as the node's own kernel would store it), i32 as int and bool as bool; a node whose
// operands and result are all i32 or bool runs the exact integer form, as the ref backend does.
#include "backend/cuda/codegen_internal.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <unordered_map>

#include "ir/primitive.h"
#include "ops/prims.h"

namespace px::cuda {

namespace detail {

bool int_like(DType d) { return d == DType::i32 || d == DType::boolean; }

std::string storage(DType d) {
  switch (d) {
    case DType::f32:
      return "float";
    case DType::bf16:
    case DType::f16:
      return "unsigned short";
    case DType::i32:
      return "int";
    case DType::boolean:
      return "unsigned char";
  }
  return "float";
}

Reg reg_of(DType d) { return d == DType::i32 ? Reg::i : d == DType::boolean ? Reg::b : Reg::f; }

std::string reg_type(Reg r) { return r == Reg::f ? "float" : r == Reg::i ? "int" : "bool"; }

std::string load(DType d, const std::string& element) {
  switch (d) {
    case DType::f32:
    case DType::i32:
      return element;
    case DType::bf16:
      return "em::bf16_to_f32(" + element + ")";
    case DType::f16:
      return "em::f16_to_f32(" + element + ")";
    case DType::boolean:
      return "(" + element + " != 0)";
  }
  return element;
}

std::string store(DType d, const std::string& v) {
  switch (d) {
    case DType::f32:
    case DType::i32:
      return v;
    case DType::bf16:
      return "em::f32_to_bf16(" + v + ")";
    case DType::f16:
      return "em::f32_to_f16(" + v + ")";
    case DType::boolean:
      return "(unsigned char)(" + v + " ? 1 : 0)";
  }
  return v;
}

std::string convert(Reg from, Reg to, const std::string& e) {
  if (from == to) return e;
  if (to == Reg::f) return from == Reg::i ? "(float)(" + e + ")" : "(" + e + " ? 1.0f : 0.0f)";
  if (to == Reg::b) return from == Reg::f ? "(" + e + " != 0.0f)" : "(" + e + " != 0)";
  return from == Reg::f ? "em::f32_to_i32(" + e + ")" : "(int)(" + e + ")";  // to int
}

std::string round_to(DType d, const std::string& v) {
  if (d == DType::bf16) return "em::round_bf16(" + v + ")";
  if (d == DType::f16) return "em::round_f16(" + v + ")";
  return v;
}

std::string flit(double v) {
  const float f = static_cast<float>(v);
  if (std::isnan(f)) return "em::nan()";
  if (std::isinf(f)) return f > 0 ? "em::inf()" : "(-em::inf())";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%af", static_cast<double>(f));  // exact
  return buf[0] == '-' ? "(" + std::string(buf) + ")" : buf;
}

std::string ilit(int64_t v) {
  if (v == INT32_MIN) return "(int)0x80000000u";
  return std::to_string(v) + (v > INT32_MAX || v < INT32_MIN ? "LL" : "");
}

std::string params(const std::vector<DType>& in, const std::vector<DType>& out) {
  std::string s;
  for (size_t k = 0; k < in.size(); ++k)
    s += (s.empty() ? "" : ", ") + std::string("const ") + storage(in[k]) + "* in" + std::to_string(k);
  for (size_t k = 0; k < out.size(); ++k) s += (s.empty() ? "" : ", ") + storage(out[k]) + "* out" + std::to_string(k);
  return s;
}

std::vector<DType> dtypes_of(const Graph& g, const std::vector<int>& values) {
  std::vector<DType> r;
  for (int v : values) r.push_back(g.type(v).dtype);
  return r;
}

// FNV-1a over the source: a kernel's name and its cache key.
uint64_t source_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

// The source's first lines: the element math, and the block-wide sum and maximum of the row kernels
// (a warp shuffle tree, then one warp over the warps' partials; blockDim.x a multiple of 32, at most
// 1024). Guarded, so that several kernels can share one translation unit. PX_EMULATED_BLOCK is
// defined only where a test compiles kernels as host code with one thread per block
// (tests/backend/test_cuda_emulated.cc): a block's reduction is then its one thread's value.
std::string prelude() {
  return std::string("#include \"") + kElementMathInclude +
         "\"\n"
         "#ifndef PX_KERNEL_PRELUDE\n"
         "#define PX_KERNEL_PRELUDE\n"
         "namespace em = px::em;\n"
         "#ifndef PX_EMULATED_BLOCK\n"
         "__device__ __forceinline__ float px_warp_sum(float v) {\n"
         "  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);\n"
         "  return v;\n}\n"
         "__device__ __forceinline__ float px_warp_max(float v) {\n"
         "  for (int o = 16; o > 0; o >>= 1) v = em::maximum(v, __shfl_xor_sync(0xffffffffu, v, o));\n"
         "  return v;\n}\n"
         "__device__ float px_block_reduce(float v, bool is_max) {\n"
         "  __shared__ float part[32];\n"
         "  v = is_max ? px_warp_max(v) : px_warp_sum(v);\n"
         "  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;\n"
         "  __syncthreads();\n"
         "  if (threadIdx.x < 32) {\n"
         "    const float id = is_max ? -em::inf() : 0.0f;\n"
         "    float w = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : id;\n"
         "    w = is_max ? px_warp_max(w) : px_warp_sum(w);\n"
         "    if (threadIdx.x == 0) part[0] = w;\n"
         "  }\n"
         "  __syncthreads();\n"
         "  const float r = part[0];\n"
         "  __syncthreads();\n"
         "  return r;\n}\n"
         "#else\n"
         "inline float px_block_reduce(float v, bool) { return v; }\n"
         "#endif\n"
         "#endif\n";
}

KernelSource finish(const std::string& family, const std::string& body, const std::string& label, Launch launch,
                    int num_inputs, int num_outputs) {
  KernelSource k;
  const std::string text = prelude() + body;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(source_hash(text)));
  k.name = "px_" + family + "_" + hash;
  k.source = text;
  for (size_t at = k.source.find("@NAME@"); at != std::string::npos; at = k.source.find("@NAME@", at))
    k.source.replace(at, 6, k.name);
  k.label = label;
  k.launch = launch;
  k.num_inputs = num_inputs;
  k.num_outputs = num_outputs;
  return k;
}

std::string grid_stride_loop(int64_t count) {
  return "  const long long n = " + std::to_string(count) +
         "LL;\n"
         "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; "
         "i += (long long)gridDim.x * blockDim.x) {\n";
}

Launch elementwise_launch(int64_t count) {
  Launch l;
  l.threads = 256;
  // Enough blocks to fill a large GPU (132 SMs x 16 blocks); the loop strides over the rest.
  l.blocks = std::max<int64_t>(1, std::min<int64_t>((count + 255) / 256, 132 * 16));
  return l;
}

std::string type_label(const TensorType& t) { return type_str(t); }

}  // namespace detail

using namespace detail;

namespace {

constexpr const char* kTanhForm = "tanh";  // gelu's attribute `approximate`: "erf" (the default) or this

bool gelu_tanh(const Attrs& a) { return a.has("approximate") && a.s("approximate") == kTanhForm; }

// The element math of a float function by primitive ("em::exp"), and of the integer form where
// the primitive has one (all operands and the result i32 or bool).
struct Fn {
  const char* f = nullptr;
  const char* i = nullptr;
  int arity = 1;
};

const std::unordered_map<const Primitive*, Fn>& functions() {
  static const std::unordered_map<const Primitive*, Fn> m = {
      {prims::add(), {"em::add", "em::iadd", 2}},
      {prims::sub(), {"em::sub", "em::isub", 2}},
      {prims::mul(), {"em::mul", "em::imul", 2}},
      {prims::div(), {"em::div", "em::idiv", 2}},
      {prims::pow(), {"em::pow", nullptr, 2}},
      {prims::maximum(), {"em::maximum", "em::imaximum", 2}},
      {prims::minimum(), {"em::minimum", "em::iminimum", 2}},
      {prims::neg(), {"em::neg", "em::ineg", 1}},
      {prims::abs(), {"em::abs", "em::iabs", 1}},
      {prims::exp(), {"em::exp", nullptr, 1}},
      {prims::log(), {"em::log", nullptr, 1}},
      {prims::tanh(), {"em::tanh", nullptr, 1}},
      {prims::sqrt(), {"em::sqrt", nullptr, 1}},
      {prims::rsqrt(), {"em::rsqrt", nullptr, 1}},
      {prims::sigmoid(), {"em::sigmoid", nullptr, 1}},
      {prims::silu(), {"em::silu", nullptr, 1}},
  };
  return m;
}

// Comparisons as C operators (on ints when both operands are integers, else on floats).
const std::unordered_map<const Primitive*, const char*>& comparisons() {
  static const std::unordered_map<const Primitive*, const char*> m = {
      {prims::eq(), "=="}, {prims::ne(), "!="}, {prims::lt(), "<"},
      {prims::le(), "<="}, {prims::gt(), ">"},  {prims::ge(), ">="},
  };
  return m;
}

bool is_identity(const Primitive* p) {
  return p == prims::stop_gradient() || p == prims::tag() || p == prims::reshape();
}

bool elementwise_prim(const Primitive* p) {
  return functions().count(p) || comparisons().count(p) || is_identity(p) || p == prims::logical_and() ||
         p == prims::logical_or() || p == prims::logical_not() || p == prims::select() || p == prims::cast() ||
         p == prims::gelu() || p == prims::gelu_grad() || p == prims::full();
}

// One elementwise kernel: the unit's nodes in order, in registers.
class Elementwise {
 public:
  Elementwise(const Graph& g, const Unit& u) : g_(g), u_(u) {}

  KernelSource emit() {
    const Node& first = g_.nodes()[u_.nodes.at(0)];
    count_ = g_.type(first.outputs.at(0)).numel();
    for (size_t k = 0; k < u_.in_values.size(); ++k) in_index_.emplace(u_.in_values[k], static_cast<int>(k));
    std::string label = u_.nodes.size() > 1 ? "fused{" : "";
    for (int ni : u_.nodes) {
      const Node& n = g_.nodes()[ni];
      node(n);
      if (u_.nodes.size() > 1) label += (label.size() > 6 ? "," : "") + n.prim->name;
    }
    if (u_.nodes.size() > 1)
      label += "}";
    else
      label = first.prim->name;
    for (size_t k = 0; k < u_.out_values.size(); ++k) {
      const int v = u_.out_values[k];
      auto it = vals_.find(v);
      if (it == vals_.end())
        throw InternalError("[cuda codegen] result %" + std::to_string(v) + " of " + label + " is not computed by it");
      const DType d = g_.type(v).dtype;
      if (g_.type(v).numel() != count_) throw Error("[cuda codegen] " + label + " mixes element counts");
      body_ += "    out" + std::to_string(k) + "[i] = " + store(d, convert(it->second.reg, reg_of(d), it->second.var)) +
               ";\n";
    }
    label += " " + type_label(g_.type(first.outputs[0]));
    const std::string src = "extern \"C\" __global__ void @NAME@(" +
                            params(dtypes_of(g_, u_.in_values), dtypes_of(g_, u_.out_values)) + ") {\n" +
                            grid_stride_loop(count_) + body_ + "  }\n}\n";
    return finish("ew", src, label, elementwise_launch(count_), static_cast<int>(u_.in_values.size()),
                  static_cast<int>(u_.out_values.size()));
  }

 private:
  struct Val {
    std::string var;
    Reg reg;
  };

  std::string fresh() { return "v" + std::to_string(next_++); }

  Val define(Reg r, const std::string& expr) {
    const std::string v = fresh();
    body_ += "    const " + reg_type(r) + " " + v + " = " + expr + ";\n";
    return {v, r};
  }

  // A value read by a node: computed in the unit, or an operand loaded once (contiguous, the
  // unit's element count).
  Val operand(int v, const Node& reader) {
    auto it = vals_.find(v);
    if (it != vals_.end()) return it->second;
    auto e = in_index_.find(v);
    if (e == in_index_.end())
      throw InternalError("[cuda codegen] an operand of '" + reader.prim->name + "' is neither an input nor computed");
    if (g_.type(v).numel() != count_)
      throw Error("[cuda codegen] an operand of '" + reader.prim->name + "' has " + type_str(g_.type(v)) + ", not " +
                  std::to_string(count_) + " elements");
    const DType d = g_.type(v).dtype;
    Val r = define(reg_of(d), load(d, "in" + std::to_string(e->second) + "[i]"));
    vals_[v] = r;
    return r;
  }

  // broadcast_in_dim of an operand: the element of the operand that result element i reads.
  Val broadcast(const Node& n) {
    const int src = n.inputs.at(0);
    auto e = in_index_.find(src);
    if (e == in_index_.end()) throw Error("[cuda codegen] broadcast_in_dim of a value computed in the group");
    const TensorType& ot = g_.type(n.outputs[0]);
    const TensorType& it = g_.type(src);
    const std::vector<int64_t>& dims = n.attrs.ints("dims");
    std::vector<int64_t> stride(ot.shape.size(), 0);
    int64_t s = 1;
    for (int d = it.rank() - 1; d >= 0; --d) {
      if (it.shape[d] != 1) stride[dims[d]] = s;
      s *= it.shape[d];
    }
    std::string index = "0LL";
    int64_t inner = 1;
    for (int d = ot.rank() - 1; d >= 0; --d) {
      if (stride[d] != 0 && ot.shape[d] != 1) {
        std::string idx = inner == 1 ? "i" : "(i / " + std::to_string(inner) + "LL)";
        if (d > 0) idx = "(" + idx + " % " + std::to_string(ot.shape[d]) + "LL)";
        index += " + " + idx + " * " + std::to_string(stride[d]) + "LL";
      }
      inner *= ot.shape[d];
    }
    return define(reg_of(it.dtype), load(it.dtype, "in" + std::to_string(e->second) + "[" + index + "]"));
  }

  void node(const Node& n) {
    if (n.outputs.size() != 1) throw Error("[cuda codegen] '" + n.prim->name + "' has several results");
    const int out = n.outputs[0];
    const DType od = g_.type(out).dtype;
    if (g_.type(out).numel() != count_) throw Error("[cuda codegen] a fused group mixes element counts");
    if (n.prim == prims::broadcast_in_dim()) {
      vals_[out] = broadcast(n);
      return;
    }
    if (is_identity(n.prim)) {
      vals_[out] = operand(n.inputs.at(0), n);
      return;
    }
    vals_[out] = compute(n, od);
  }

  Val compute(const Node& n, DType od) {
    std::vector<Val> a;
    for (int v : n.inputs) a.push_back(operand(v, n));
    bool all_int = int_like(od);
    for (int v : n.inputs) all_int = all_int && int_like(g_.type(v).dtype);
    const Reg oreg = reg_of(od);
    auto as = [&](size_t k, Reg r) { return convert(a[k].reg, r, a[k].var); };
    if (n.prim == prims::full()) {
      const double v = n.attrs.f("value");
      if (oreg == Reg::f) return define(Reg::f, flit(round_value(od, v)));
      if (oreg == Reg::b) return define(Reg::b, v != 0.0 ? "true" : "false");
      return define(Reg::i, ilit(saturate_i32(v)));
    }
    if (n.prim == prims::cast()) {
      const DType from = g_.type(n.inputs[0]).dtype;
      if (oreg == Reg::f) return define(Reg::f, round_to(od, as(0, Reg::f)));
      if (oreg == Reg::b) return define(Reg::b, as(0, Reg::b));
      return define(Reg::i, reg_of(from) == Reg::f ? "em::f32_to_i32(" + a[0].var + ")" : as(0, Reg::i));
    }
    if (n.prim == prims::select()) {
      const std::string e = "(" + as(0, Reg::b) + " ? " + as(1, oreg) + " : " + as(2, oreg) + ")";
      return define(oreg, e);
    }
    if (auto c = comparisons().find(n.prim); c != comparisons().end()) {
      const bool ints = int_like(g_.type(n.inputs[0]).dtype) && int_like(g_.type(n.inputs[1]).dtype);
      const Reg r = ints ? Reg::i : Reg::f;
      return define(Reg::b, "(" + as(0, r) + " " + c->second + " " + as(1, r) + ")");
    }
    if (n.prim == prims::logical_and() || n.prim == prims::logical_or())
      return define(Reg::b,
                    "(" + as(0, Reg::b) + (n.prim == prims::logical_and() ? " && " : " || ") + as(1, Reg::b) + ")");
    if (n.prim == prims::logical_not()) return define(Reg::b, "(!" + as(0, Reg::b) + ")");
    std::string call;
    Reg result = Reg::f;
    if (n.prim == prims::gelu() || n.prim == prims::gelu_grad()) {
      call = std::string(n.prim == prims::gelu() ? "em::gelu(" : "em::gelu_grad(") + as(0, Reg::f) + ", " +
             (gelu_tanh(n.attrs) ? "true" : "false") + ")";
    } else {
      auto f = functions().find(n.prim);
      if (f == functions().end())
        throw Error("[cuda codegen] no elementwise kernel for primitive '" + n.prim->name + "'");
      const bool integer = all_int && f->second.i;
      result = integer ? Reg::i : Reg::f;
      call = std::string(integer ? f->second.i : f->second.f) + "(" + as(0, result);
      if (f->second.arity == 2) call += ", " + as(1, result);
      call += ")";
    }
    if (result == Reg::f) return define(oreg, convert(Reg::f, oreg, round_to(od, call)));
    return define(oreg, convert(Reg::i, oreg, call));
  }

  const Graph& g_;
  const Unit& u_;
  int64_t count_ = 0;
  int next_ = 0;
  std::string body_;
  std::map<int, int> in_index_;
  std::map<int, Val> vals_;
};

}  // namespace

namespace detail {

double round_value(DType d, double v) {
  const float f = static_cast<float>(v);
  if (d == DType::bf16) return bf16_to_f32(f32_to_bf16(f));
  if (d == DType::f16) return f16_to_f32(f32_to_f16(f));
  return f;
}

int64_t saturate_i32(double v) {
  if (std::isnan(v)) return 0;
  if (v <= -2147483648.0) return INT32_MIN;
  if (v >= 2147483647.0) return INT32_MAX;
  return static_cast<int64_t>(v);
}

}  // namespace detail

bool can_generate_elementwise(const Graph& g, const Node& n) {
  if (n.outputs.size() != 1 || !n.prim->elementwise) return false;
  return elementwise_prim(n.prim) && n.prim != prims::reshape();
}

bool can_generate(const Primitive* p) { return elementwise_prim(p) || can_generate_row(p); }

KernelSource generate(const Graph& g, const Unit& unit) {
  if (unit.nodes.empty()) throw InternalError("[cuda codegen] an empty unit");
  if (unit.kind == Unit::Kind::fused) return Elementwise(g, unit).emit();
  if (unit.kind != Unit::Kind::kernel)
    throw InternalError("[cuda codegen] asked for a unit that is not a kernel: " + unit.label);
  const Node& n = g.nodes()[unit.nodes[0]];
  if (elementwise_prim(n.prim) || n.prim == prims::broadcast_in_dim()) return Elementwise(g, unit).emit();
  return generate_row(g, unit, n);
}

}  // namespace px::cuda
