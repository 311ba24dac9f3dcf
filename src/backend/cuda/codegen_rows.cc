// The generator's row kernels (reductions, softmax, the norms and their gradients, cross entropy
// and its gradient: one block of 256 threads per row, block-wide sums and maxima in f32), and its
// per-element kernels of the index, shape, optimizer and random families (a grid-stride loop).
//
// Semantics are the primitives' as the ref backend computes them (src/backend/ref/): float rows
// are accumulated in f32 here (the ref backend accumulates in double), in a tree order, so results
// agree within f32 rounding, not bitwise; i32 sums wrap and i32 maxima are exact. A reduction whose
// reduced dims are not the trailing ones runs one thread per result element.
#include <algorithm>
#include <map>

#include "backend/cuda/codegen_internal.h"
#include "backend/element_math.h"
#include "ir/primitive.h"
#include "ops/prims.h"

namespace px::cuda::detail {

namespace {

std::string i64(int64_t v) { return std::to_string(v) + "LL"; }

std::string header(const Graph& g, const Unit& u) {
  return "extern \"C\" __global__ void @NAME@(" + params(dtypes_of(g, u.in_values), dtypes_of(g, u.out_values)) +
         ") {\n";
}

KernelSource done(const std::string& family, const std::string& body, const Graph& g, const Unit& u, const Node& n,
                  Launch launch) {
  return finish(family, body, n.prim->name + " " + type_label(g.type(n.inputs.empty() ? n.outputs[0] : n.inputs[0])),
                launch, static_cast<int>(u.in_values.size()), static_cast<int>(u.out_values.size()));
}

Launch rows_launch(int64_t rows) {
  Launch l;
  l.blocks = std::max<int64_t>(rows, 1);
  l.threads = 256;
  return l;
}

// ---- reductions --------------------------------------------------------------------------------

KernelSource reduce(const Graph& g, const Unit& u, const Node& n) {
  const bool is_max = n.prim == prims::reduce_max();
  const TensorType& x = g.type(n.inputs[0]);
  const DType od = g.type(n.outputs[0]).dtype;
  std::vector<char> reduced(x.shape.size(), 0);
  for (int64_t a : n.attrs.ints("axes")) reduced.at(static_cast<size_t>(a)) = 1;
  // Trailing reduced dims: each result element sums one contiguous row.
  size_t lead = reduced.size();
  while (lead > 0 && reduced[lead - 1]) --lead;
  bool trailing = true;
  for (size_t d = 0; d < lead; ++d) trailing = trailing && !reduced[d];
  const int64_t out_n = g.type(n.outputs[0]).numel(), in_n = x.numel();
  const int64_t len = out_n == 0 ? 0 : in_n / out_n;
  const bool integer = x.dtype == DType::i32;
  std::string b = header(g, u);
  if (trailing && !integer) {
    b += "  const long long row = blockIdx.x, len = " + i64(len) + ";\n";
    b += std::string("  float acc = ") + (is_max ? "-em::inf()" : "0.0f") + ";\n";
    b += "  for (long long k = threadIdx.x; k < len; k += blockDim.x) {\n";
    b += "    const float v = " + load(x.dtype, "in0[row * len + k]") + ";\n";
    b += is_max ? "    acc = em::maximum(v, acc);\n" : "    acc += v;\n";
    b += "  }\n";
    b += std::string("  acc = px_block_reduce(acc, ") + (is_max ? "true" : "false") + ");\n";
    b += "  if (threadIdx.x == 0) out0[row] = " + store(od, "acc") + ";\n}\n";
    return done(is_max ? "rmax" : "rsum", b, g, u, n, rows_launch(out_n));
  }
  // One thread per result element: its base offset from the kept dims, then the reduced ones.
  std::vector<int64_t> strides(x.shape.size(), 1);
  for (int d = static_cast<int>(x.shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * x.shape[d + 1];
  std::string base = "0LL", offset = "0LL";
  int64_t kept_inner = 1, red_inner = 1;
  for (int d = static_cast<int>(x.shape.size()) - 1; d >= 0; --d) {
    const std::string idx_of = reduced[d] ? "r" : "i";
    int64_t& inner = reduced[d] ? red_inner : kept_inner;
    const std::string idx = "((" + idx_of + " / " + i64(inner) + ") % " + i64(x.shape[d]) + ")";
    (reduced[d] ? offset : base) += " + " + idx + " * " + i64(strides[d]);
    inner *= x.shape[d];
  }
  const std::string acc_t = integer ? (is_max ? "int" : "unsigned int") : "float";
  b += grid_stride_loop(out_n);
  b += "    const long long base = " + base + ";\n";
  b += "    " + acc_t + " acc = " + (is_max ? (integer ? "(int)0x80000000u" : "-em::inf()") : "0") + ";\n";
  b += "    for (long long r = 0; r < " + i64(len) + "; ++r) {\n";
  b += "      const long long at = base + " + offset + ";\n";
  if (integer)
    b += is_max ? "      acc = in0[at] > acc ? in0[at] : acc;\n" : "      acc += (unsigned int)in0[at];\n";
  else
    b += is_max ? "      acc = em::maximum(" + load(x.dtype, "in0[at]") + ", acc);\n"
                : "      acc += " + load(x.dtype, "in0[at]") + ";\n";
  b += "    }\n";
  b += "    out0[i] = " + (integer ? std::string("(int)acc") : store(od, "acc")) + ";\n  }\n}\n";
  return done(is_max ? "rmax" : "rsum", b, g, u, n, elementwise_launch(out_n));
}

// ---- softmax and log_softmax --------------------------------------------------------------------

KernelSource softmax(const Graph& g, const Unit& u, const Node& n) {
  const bool log = n.prim == prims::log_softmax();
  const TensorType& t = g.type(n.inputs[0]);
  const int axis = static_cast<int>(n.attrs.i("axis"));
  int64_t outer = 1, inner = 1;
  const int64_t len = t.shape.at(axis);
  for (int d = 0; d < axis; ++d) outer *= t.shape[d];
  for (int d = axis + 1; d < t.rank(); ++d) inner *= t.shape[d];
  const DType od = g.type(n.outputs[0]).dtype;
  const std::string at = "(base + k * " + i64(inner) + ")";
  std::string b = header(g, u);
  b += "  const long long row = blockIdx.x, base = (row / " + i64(inner) + ") * " + i64(len * inner) + " + row % " +
       i64(inner) + ";\n";
  b += "  float m = -em::inf();\n";
  b += "  for (long long k = threadIdx.x; k < " + i64(len) + "; k += blockDim.x) m = em::maximum(" +
       load(t.dtype, "in0[" + at + "]") + ", m);\n";
  b += "  m = px_block_reduce(m, true);\n";
  b += "  float s = 0.0f;\n";
  b += "  for (long long k = threadIdx.x; k < " + i64(len) + "; k += blockDim.x) s += em::exp(" +
       load(t.dtype, "in0[" + at + "]") + " - m);\n";
  b += "  s = px_block_reduce(s, false);\n";
  b += log ? "  const float lse = m + em::log(s);\n" : "  const float inv = 1.0f / s;\n";
  b += "  for (long long k = threadIdx.x; k < " + i64(len) + "; k += blockDim.x) {\n";
  b += "    const float x = " + load(t.dtype, "in0[" + at + "]") + ";\n";
  b += "    out0[" + at + "] = " + store(od, log ? "x - lse" : "em::exp(x - m) * inv") + ";\n  }\n}\n";
  return done(log ? "logsoftmax" : "softmax", b, g, u, n, rows_launch(outer * inner));
}

// ---- layer_norm and rms_norm, and their gradients -------------------------------------------

KernelSource norm(const Graph& g, const Unit& u, const Node& n) {
  const bool rms = n.prim == prims::rms_norm();
  const TensorType& t = g.type(n.inputs[0]);
  const int64_t d = t.shape.back(), rows = d == 0 ? 0 : t.numel() / d;
  const bool beta = n.inputs.size() > 2;
  const DType gd = g.type(n.inputs[1]).dtype, od = g.type(n.outputs[0]).dtype;
  const std::string x = load(t.dtype, "in0[row * " + i64(d) + " + k]");
  const std::string loop = "  for (long long k = threadIdx.x; k < " + i64(d) + "; k += blockDim.x)";
  std::string b = header(g, u);
  b += "  const long long row = blockIdx.x;\n";
  b += "  const float inv_d = " + flit(d > 0 ? 1.0 / static_cast<double>(d) : 0.0) + ";\n";
  b += "  float mean = 0.0f;\n";
  if (!rms) {
    b += loop + " mean += " + x + ";\n";
    b += "  mean = px_block_reduce(mean, false) * inv_d;\n";
  }
  b += "  float var = 0.0f;\n";
  b += loop + " { const float c = " + x + " - mean; var += c * c; }\n";
  b += "  var = px_block_reduce(var, false) * inv_d;\n";
  b += "  const float rstd = 1.0f / sqrtf(var + " + flit(n.attrs.f("eps")) + ");\n";
  b += loop + " {\n";
  b += "    float y = (" + x + " - mean) * rstd * " + load(gd, "in1[k]") + ";\n";
  if (beta) b += "    y += " + load(g.type(n.inputs[2]).dtype, "in2[k]") + ";\n";
  b += "    out0[row * " + i64(d) + " + k] = " + store(od, "y") + ";\n  }\n";
  b += "  if (threadIdx.x == 0) {\n";
  if (!rms) b += "    out1[row] = mean;\n";
  b += std::string("    out") + (rms ? "1" : "2") + "[row] = rstd;\n  }\n}\n";
  return done(rms ? "rmsnorm" : "layernorm", b, g, u, n, rows_launch(rows));
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma (rms: no mean(g) term), and the
// per-element dy xhat that the gamma gradient sums.
KernelSource norm_grad(const Graph& g, const Unit& u, const Node& n) {
  const bool rms = n.prim == prims::rms_norm_grad();
  const TensorType& t = g.type(n.inputs[0]);
  const int64_t d = t.shape.back(), rows = d == 0 ? 0 : t.numel() / d;
  const DType gd = g.type(n.inputs[1]).dtype, yd = g.type(n.inputs.back()).dtype;
  const std::string dy = rms ? "in3" : "in4", rstd = rms ? "in2" : "in3";
  const std::string e = "row * " + i64(d) + " + k";
  const std::string loop = "  for (long long k = threadIdx.x; k < " + i64(d) + "; k += blockDim.x)";
  std::string b = header(g, u);
  b += "  const long long row = blockIdx.x;\n";
  b += "  const float inv_d = " + flit(d > 0 ? 1.0 / static_cast<double>(d) : 0.0) + ";\n";
  b += std::string("  const float mean = ") + (rms ? "0.0f" : "in2[row]") + ", rstd = " + rstd + "[row];\n";
  const std::string xh = "((" + load(t.dtype, "in0[" + e + "]") + " - mean) * rstd)";
  const std::string gk = "(" + load(yd, dy + "[" + e + "]") + " * " + load(gd, "in1[k]") + ")";
  b += "  float mg = 0.0f, mgx = 0.0f;\n";
  b += loop + " {\n    const float xh = " + xh + ", gk = " + gk + ";\n    mg += gk;\n    mgx += gk * xh;\n";
  b +=
      "    out1[" + e + "] = " + store(g.type(n.outputs[1]).dtype, load(yd, dy + "[" + e + "]") + " * xh") + ";\n  }\n";
  b += std::string("  mg = ") + (rms ? "0.0f" : "px_block_reduce(mg, false) * inv_d") + ";\n";
  b += "  mgx = px_block_reduce(mgx, false) * inv_d;\n";
  b += loop + " {\n    const float xh = " + xh + ", gk = " + gk + ";\n";
  b += "    out0[" + e + "] = " + store(g.type(n.outputs[0]).dtype, "rstd * (gk - mg - xh * mgx)") + ";\n  }\n}\n";
  return done(rms ? "rmsnormgrad" : "layernormgrad", b, g, u, n, rows_launch(rows));
}

// ---- softmax cross entropy and its gradient -------------------------------------------------

KernelSource cross_entropy(const Graph& g, const Unit& u, const Node& n) {
  const bool grad = n.prim == prims::softmax_cross_entropy_grad();
  const TensorType& t = g.type(n.inputs[0]);
  const int64_t v = t.shape.back(), rows = g.type(n.inputs[1]).numel();
  const DType od = g.type(n.outputs[0]).dtype;
  const std::string x = load(t.dtype, "in0[row * " + i64(v) + " + k]");
  const std::string loop = "  for (long long k = threadIdx.x; k < " + i64(v) + "; k += blockDim.x)";
  std::string b = header(g, u);
  b += "  const long long row = blockIdx.x;\n";
  b += "  const int label = in1[row];\n";
  b += "  const bool ignored = label == " + ilit(n.attrs.i("ignore_index")) + ";\n";
  b += "  const bool bad = !ignored && (label < 0 || label >= " + i64(v) + ");\n";
  b += "  float m = -em::inf();\n" + loop + " m = em::maximum(" + x + ", m);\n  m = px_block_reduce(m, true);\n";
  b += "  float s = 0.0f;\n" + loop + " s += em::exp(" + x + " - m);\n  s = px_block_reduce(s, false);\n";
  if (!grad) {
    b += "  if (threadIdx.x == 0) {\n";
    b += "    const float loss = bad ? em::nan() : ignored ? 0.0f : m + em::log(s) - " +
         load(t.dtype, "in0[row * " + i64(v) + " + label]") + ";\n";
    b += "    out0[row] = " + store(od, "loss") + ";\n  }\n}\n";
    return done("xent", b, g, u, n, rows_launch(rows));
  }
  b += "  const float c = ignored ? 0.0f : in2[row], inv = 1.0f / s;\n";
  b += loop + " {\n";
  b += "    const float p = em::exp(" + x + " - m) * inv - (k == label ? 1.0f : 0.0f);\n";
  b += "    const float gk = bad ? em::nan() : c == 0.0f ? 0.0f : p * c;\n";
  b += "    out0[row * " + i64(v) + " + k] = " + store(od, "gk") + ";\n  }\n}\n";
  return done("xentgrad", b, g, u, n, rows_launch(rows));
}

// ---- index family -------------------------------------------------------------------------------

std::string clamp_row(const std::string& idx, int64_t rows) {
  return "(" + idx + " < 0 ? 0LL : " + idx + " >= " + i64(rows) + " ? " + i64(rows - 1) + " : (long long)" + idx + ")";
}

KernelSource take(const Graph& g, const Unit& u, const Node& n) {
  const TensorType& table = g.type(n.inputs[0]);
  const int64_t rows = table.shape.at(0), per = rows == 0 ? 0 : table.numel() / rows;
  const int64_t count = g.type(n.outputs[0]).numel();
  std::string b = header(g, u) + grid_stride_loop(count);
  b += "    const long long j = i / " + i64(std::max<int64_t>(per, 1)) + ", c = i % " + i64(std::max<int64_t>(per, 1)) +
       ";\n";
  b += "    const int idx = in1[j];\n";
  b += "    out0[i] = in0[" + clamp_row("idx", rows) + " * " + i64(per) + " + c];\n  }\n}\n";
  return done("take", b, g, u, n, elementwise_launch(count));
}

// f32 and i32 results: the launcher zeroes the result (KernelSource::zero_outputs) and each update
// element is added at its row with an atomic add, one thread per update element (f32 sums are then
// in no fixed order: equal to the ref backend's within rounding, not bitwise from run to run; i32
// sums wrap, exactly). 16-bit results: each result element sums its updates in index order (the ref
// backend's order), a loop over every index per element, slow for large tables.
KernelSource scatter_add(const Graph& g, const Unit& u, const Node& n) {
  const TensorType& ot = g.type(n.outputs[0]);
  const int64_t rows = ot.shape.at(0), d = rows == 0 ? 0 : ot.numel() / rows, k = g.type(n.inputs[0]).numel();
  const std::string dd = i64(std::max<int64_t>(d, 1));
  if (ot.dtype == DType::f32 || ot.dtype == DType::i32) {
    std::string b = header(g, u) + grid_stride_loop(k * d);
    b += "    const long long j = i / " + dd + ", c = i % " + dd + ";\n";
    b += "    const int idx = in0[j];\n";
    b += "    atomicAdd(&out0[" + clamp_row("idx", rows) + " * " + dd + " + c], in1[i]);\n  }\n}\n";
    KernelSource ks = done("scatter", b, g, u, n, elementwise_launch(k * d));
    ks.zero_outputs = true;
    return ks;
  }
  std::string b = header(g, u) + grid_stride_loop(ot.numel());
  b += "    const long long r = i / " + dd + ", c = i % " + dd + ";\n";
  b += "    float acc = 0.0f;\n";
  b += "    for (long long j = 0; j < " + i64(k) + "; ++j) {\n";
  b += "      const int idx = in0[j];\n";
  b += "      if (" + clamp_row("idx", rows) + " == r) acc += " + load(ot.dtype, "in1[j * " + i64(d) + " + c]") +
       ";\n    }\n";
  b += "    out0[i] = " + store(ot.dtype, "acc") + ";\n  }\n}\n";
  return done("scatter", b, g, u, n, elementwise_launch(ot.numel()));
}

KernelSource one_hot(const Graph& g, const Unit& u, const Node& n) {
  const int64_t depth = n.attrs.i("depth");
  const TensorType& ot = g.type(n.outputs[0]);
  const Reg r = reg_of(ot.dtype);
  std::string b = header(g, u) + grid_stride_loop(ot.numel());
  b += "    const bool hit = in0[i / " + i64(std::max<int64_t>(depth, 1)) + "] == i % " +
       i64(std::max<int64_t>(depth, 1)) + ";\n";
  b += "    out0[i] = " + store(ot.dtype, convert(Reg::b, r, "hit")) + ";\n  }\n}\n";
  return done("onehot", b, g, u, n, elementwise_launch(ot.numel()));
}

KernelSource iota(const Graph& g, const Unit& u, const Node& n) {
  const TensorType& ot = g.type(n.outputs[0]);
  const int axis = static_cast<int>(n.attrs.i("axis"));
  int64_t inner = 1;
  for (int d = axis + 1; d < ot.rank(); ++d) inner *= ot.shape[d];
  std::string b = header(g, u) + grid_stride_loop(ot.numel());
  b += "    const long long k = (i / " + i64(inner) + ") % " + i64(ot.shape.at(axis)) + ";\n";
  const Reg r = reg_of(ot.dtype);
  const std::string v = r == Reg::f ? round_to(ot.dtype, "(float)k") : r == Reg::i ? "(int)k" : "(k != 0)";
  b += "    out0[i] = " + store(ot.dtype, v) + ";\n  }\n}\n";
  return done("iota", b, g, u, n, elementwise_launch(ot.numel()));
}

// ---- adamw_update -------------------------------------------------------------------------------

KernelSource adamw(const Graph& g, const Unit& u, const Node& n) {
  const DType pt = g.type(n.inputs[0]).dtype, gt = g.type(n.inputs[1]).dtype, ot = g.type(n.outputs[0]).dtype;
  const int64_t count = g.type(n.inputs[0]).numel();
  const bool decay = n.attrs.i("decay") != 0;
  const double b1 = n.attrs.f("beta1"), b2 = n.attrs.f("beta2");
  std::string b = header(g, u);
  b += "  const float step = in4[0], inv_sqrt_bc2 = in5[0], wd = " + std::string(decay ? "in6[0]" : "0.0f") + ";\n";
  b += grid_stride_loop(count);
  b += "    const em::AdamW r = em::adamw(" + load(pt, "in0[i]") + ", " + load(gt, "in1[i]") + ", in2[i], in3[i], " +
       flit(b1) + ", " + flit(1.0 - b1) + ", " + flit(b2) + ", " + flit(1.0 - b2) + ", " + flit(n.attrs.f("eps")) +
       ", step, inv_sqrt_bc2, " + (decay ? "true" : "false") + ", wd);\n";
  b += "    out0[i] = " + store(ot, round_to(ot, "r.p")) + ";\n    out1[i] = r.m;\n    out2[i] = r.v;\n  }\n}\n";
  return done("adamw", b, g, u, n, elementwise_launch(count));
}

// ---- random_uniform, random_normal and fold_in --------------------------------------------

// The global flat index of local element i of a draw that may be a block of a larger one, placed
// at the attr `offset` or at the i32[rank] origin operand (in1).
std::string global_index(const Graph& g, const Node& n) {
  const std::vector<int64_t>& shape = g.type(n.outputs[0]).shape;
  const std::vector<int64_t> global = n.attrs.has("global_shape") ? n.attrs.ints("global_shape") : shape;
  const std::vector<int64_t> offset =
      n.attrs.has("offset") ? n.attrs.ints("offset") : std::vector<int64_t>(shape.size(), 0);
  const bool operand = n.inputs.size() == 2;
  std::string s = "0LL";
  int64_t local_inner = 1, gstride = 1;
  for (int d = static_cast<int>(shape.size()) - 1; d >= 0; --d) {
    const std::string origin = operand ? "(long long)in1[" + std::to_string(d) + "]" : i64(offset[d]);
    s += " + ((i / " + i64(local_inner) + ") % " + i64(shape[d]) + " + " + origin + ") * " + i64(gstride);
    local_inner *= shape[d];
    gstride *= global[d];
  }
  return s;
}

KernelSource random(const Graph& g, const Unit& u, const Node& n) {
  const bool uniform = n.prim == prims::random_uniform();
  const TensorType& ot = g.type(n.outputs[0]);
  std::string b = header(g, u);
  b += "  const unsigned int k0 = (unsigned int)in0[0], k1 = (unsigned int)in0[1];\n";
  b += grid_stride_loop(ot.numel());
  b += "    const unsigned long long gi = (unsigned long long)(" + global_index(g, n) + ");\n";
  if (uniform) {
    const int code = ot.dtype == DType::bf16 ? em::kBF16 : ot.dtype == DType::f16 ? em::kF16 : em::kF32;
    const float lo = static_cast<float>(n.attrs.f("lo")), hi = static_cast<float>(n.attrs.f("hi"));
    const em::UniformBounds bounds = em::uniform_bounds(code, lo, hi);  // once, here on the host
    b += "    const float v = em::uniform_in_range(em::uniform(gi, k0, k1, " + flit(lo) + ", " + flit(hi) + "), " +
         std::to_string(code) + ", " + flit(lo) + ", " + flit(hi) + ", em::UniformBounds{" + flit(bounds.top) + ", " +
         flit(bounds.bottom) + "});\n";
  } else {
    b += "    const float v = " + round_to(ot.dtype, "em::normal(gi, k0, k1)") + ";\n";
  }
  b += "    out0[i] = " + store(ot.dtype, "v") + ";\n  }\n}\n";
  return done(uniform ? "uniform" : "normal", b, g, u, n, elementwise_launch(ot.numel()));
}

KernelSource fold_in(const Graph& g, const Unit& u, const Node& n) {
  const uint64_t data = static_cast<uint64_t>(n.attrs.i("data"));
  std::string b = header(g, u);
  b += "  if (blockIdx.x != 0 || threadIdx.x != 0) return;\n";
  b += "  const em::Philox r = em::fold_in((unsigned int)in0[0], (unsigned int)in0[1], " + std::to_string(data) +
       "ULL);\n";
  b += "  out0[0] = (int)r.w[0];\n  out0[1] = (int)r.w[1];\n}\n";
  Launch one;
  one.threads = 32;
  return done("foldin", b, g, u, n, one);
}

// ---- shape ops: transpose, slice, pad, concat ------------------------------------------------

// Each result element reads the operand element it comes from (pad: or takes the pad value);
// elements move as stored, without conversion. idx<d> is the result index along dim d.
KernelSource shape_op(const Graph& g, const Unit& u, const Node& n) {
  const TensorType& ot = g.type(n.outputs[0]);
  const TensorType& xt = g.type(n.inputs[0]);
  const int r = ot.rank();
  std::vector<int64_t> xs(static_cast<size_t>(xt.rank()), 1);
  for (int d = xt.rank() - 2; d >= 0; --d) xs[d] = xs[d + 1] * xt.shape[d + 1];
  std::string b = header(g, u) + grid_stride_loop(ot.numel());
  int64_t inner = 1;
  for (int d = r - 1; d >= 0; --d) {
    b += "    const long long idx" + std::to_string(d) + " = (i / " + i64(inner) + ") % " + i64(ot.shape[d]) + ";\n";
    inner *= ot.shape[d];
  }
  std::string src = "0LL";
  if (n.prim == prims::transpose()) {
    const std::vector<int64_t>& perm = n.attrs.ints("perm");
    for (int j = 0; j < r; ++j) src += " + idx" + std::to_string(j) + " * " + i64(xs.at(perm.at(j)));
    b += "    out0[i] = in0[" + src + "];\n";
  } else if (n.prim == prims::slice()) {
    const std::vector<int64_t>& starts = n.attrs.ints("starts");
    const std::vector<int64_t> steps =
        n.attrs.has("strides") ? n.attrs.ints("strides") : std::vector<int64_t>(static_cast<size_t>(r), 1);
    for (int d = 0; d < r; ++d)
      src += " + (" + i64(starts.at(d)) + " + idx" + std::to_string(d) + " * " + i64(steps.at(d)) + ") * " + i64(xs[d]);
    b += "    out0[i] = in0[" + src + "];\n";
  } else if (n.prim == prims::pad()) {
    const std::vector<int64_t>& lo = n.attrs.ints("lo");
    const std::vector<int64_t> interior =
        n.attrs.has("interior") ? n.attrs.ints("interior") : std::vector<int64_t>(static_cast<size_t>(r), 0);
    b += "    bool inside = true;\n    long long at = 0, q;\n";
    for (int d = 0; d < r; ++d) {
      const int64_t step = interior.at(d) + 1;
      b += "    q = idx" + std::to_string(d) + " - " + i64(lo.at(d)) + ";\n";
      b += "    inside = inside && q >= 0 && q % " + i64(step) + " == 0 && q / " + i64(step) + " < " +
           i64(xt.shape[d]) + ";\n";
      b += "    at += (q / " + i64(step) + ") * " + i64(xs[d]) + ";\n";
    }
    const double v = n.attrs.f("value", 0.0);
    const Reg reg = reg_of(ot.dtype);
    const std::string value = reg == Reg::f   ? flit(round_value(ot.dtype, v))
                              : reg == Reg::i ? ilit(saturate_i32(v))
                                              : std::string(v != 0.0 ? "true" : "false");
    b += "    out0[i] = inside ? in0[at] : (" + storage(ot.dtype) + ")" + store(ot.dtype, value) + ";\n";
  } else {  // concat: the operand whose range along `axis` holds the index
    const int64_t axis = n.attrs.i("axis");
    int64_t at = 0;
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const TensorType& t = g.type(n.inputs[k]);
      std::vector<int64_t> ts(static_cast<size_t>(t.rank()), 1);
      for (int d = t.rank() - 2; d >= 0; --d) ts[d] = ts[d + 1] * t.shape[d + 1];
      std::string e = "0LL";
      for (int d = 0; d < r; ++d)
        e += " + " + (d == axis ? "(idx" + std::to_string(d) + " - " + i64(at) + ")" : "idx" + std::to_string(d)) +
             " * " + i64(ts[d]);
      const int64_t end = at + t.shape.at(axis);
      b += "    " + std::string(k ? "else " : "") + "if (idx" + std::to_string(axis) + " < " + i64(end) +
           ") out0[i] = in" + std::to_string(k) + "[" + e + "];\n";
      at = end;
    }
  }
  b += "  }\n}\n";
  return done("shape", b, g, u, n, elementwise_launch(ot.numel()));
}

using Generator = KernelSource (*)(const Graph&, const Unit&, const Node&);

const std::map<const Primitive*, Generator>& generators() {
  static const std::map<const Primitive*, Generator> m = {
      {prims::reduce_sum(), reduce},
      {prims::reduce_max(), reduce},
      {prims::softmax(), softmax},
      {prims::log_softmax(), softmax},
      {prims::layer_norm(), norm},
      {prims::rms_norm(), norm},
      {prims::layer_norm_grad(), norm_grad},
      {prims::rms_norm_grad(), norm_grad},
      {prims::softmax_cross_entropy(), cross_entropy},
      {prims::softmax_cross_entropy_grad(), cross_entropy},
      {prims::take(), take},
      {prims::scatter_add(), scatter_add},
      {prims::one_hot(), one_hot},
      {prims::iota(), iota},
      {prims::adamw_update(), adamw},
      {prims::random_uniform(), random},
      {prims::random_normal(), random},
      {prims::fold_in(), fold_in},
      {prims::transpose(), shape_op},
      {prims::slice(), shape_op},
      {prims::pad(), shape_op},
      {prims::concat(), shape_op},
  };
  return m;
}

}  // namespace

bool can_generate_row(const Primitive* p) { return generators().count(p) != 0; }

KernelSource generate_row(const Graph& g, const Unit& unit, const Node& n) {
  auto it = generators().find(n.prim);
  if (it == generators().end())
    throw Error("[cuda codegen] no generated kernel for primitive '" + n.prim->name +
                "' (matmuls and attention are for cuBLASLt and cuDNN, not generated)");
  return it->second(g, unit, n);
}

}  // namespace px::cuda::detail
