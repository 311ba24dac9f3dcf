// Reference kernels of the shape family: reshape, transpose, broadcast_in_dim, slice, pad,
// concat, and the sharding primitives sharding_constraint (an identity) and local_slice (this
// device's block of a dim). All of them move elements without arithmetic, so they copy bytes;
// only pad converts its `value` attribute to the element dtype.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>

#include "backend/ref/ref.h"
#include "ops/prims.h"

namespace px::ref {

namespace {

using Ints = std::vector<int64_t>;

// One strided element copy: for every index (i_0, ..., i_{r-1}) of `shape`, the element at
// src_base + sum(i_d * src_st[d]) goes to dst_base + sum(i_d * dst_st[d]) (offsets in elements).
struct Copy {
  Ints shape, src_st, dst_st;
  int64_t src_base = 0, dst_base = 0;
  int64_t esize = 1;

  // shift: elements added to src_base for this call.
  void run(const void* src, void* dst, int64_t shift = 0) const {
    int64_t n = numel(shape);
    if (n == 0) return;
    const std::byte* s = static_cast<const std::byte*>(src);
    std::byte* d = static_cast<std::byte*>(dst);
    const int r = static_cast<int>(shape.size());
    Ints idx(shape.size(), 0);
    int64_t so = src_base + shift, dof = dst_base;
    for (int64_t k = 0; k < n; ++k) {
      std::memcpy(d + dof * esize, s + so * esize, static_cast<size_t>(esize));
      // Advance the index like an odometer, keeping both offsets in step.
      for (int ax = r - 1; ax >= 0; --ax) {
        ++idx[ax];
        so += src_st[ax];
        dof += dst_st[ax];
        if (idx[ax] < shape[ax]) break;
        so -= src_st[ax] * shape[ax];
        dof -= dst_st[ax] * shape[ax];
        idx[ax] = 0;
      }
    }
  }
};

Kernel copy_kernel(Copy c) {
  return [c = std::move(c)](const void* const* in, void* const* out) { c.run(in[0], out[0]); };
}

Kernel make_memcpy(const Spec& s) {
  size_t bytes = static_cast<size_t>(s.out.at(0).nbytes());
  return [bytes](const void* const* in, void* const* out) {
    if (bytes && in[0] != out[0]) std::memcpy(out[0], in[0], bytes);
  };
}

Kernel make_reshape(const Spec& s) {
  if (s.in.at(0).nbytes() != s.out.at(0).nbytes())
    throw InternalError("[ref] reshape of " + type_str(s.in[0]) + " to " + type_str(s.out.at(0)));
  return make_memcpy(s);
}

// transpose: result dim j is operand dim perm[j].
Kernel make_transpose(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const Ints& perm = s.attrs.ints("perm");
  Ints xs = strides_of(x.shape);
  Copy c;
  c.shape = s.out.at(0).shape;
  c.dst_st = strides_of(c.shape);
  for (int64_t p : perm) c.src_st.push_back(xs.at(p));
  c.esize = dtype_size(x.dtype);
  return copy_kernel(c);
}

// broadcast_in_dim: operand dim i is result dim dims[i] (size-1 operand dims repeat); the result
// dims not named in dims are new and repeat the operand.
Kernel make_broadcast(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const TensorType& t = s.out.at(0);
  const Ints& dims = s.attrs.ints("dims");
  if (static_cast<int>(dims.size()) != x.rank())
    throw InternalError("[ref] broadcast_in_dim: dims do not match " + type_str(x));
  Ints xs = strides_of(x.shape);
  Copy c;
  c.shape = t.shape;
  c.dst_st = strides_of(t.shape);
  c.src_st.assign(t.shape.size(), 0);
  for (size_t i = 0; i < dims.size(); ++i)
    if (x.shape[i] != 1) c.src_st.at(dims[i]) = xs[i];
  c.esize = dtype_size(t.dtype);
  return copy_kernel(c);
}

// slice: result index i of dim d reads operand index starts[d] + i * strides[d].
Kernel make_slice(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const Ints& starts = s.attrs.ints("starts");
  Ints steps = s.attrs.has("strides") ? s.attrs.ints("strides") : Ints(x.shape.size(), 1);
  Ints xs = strides_of(x.shape);
  Copy c;
  c.shape = s.out.at(0).shape;
  c.dst_st = strides_of(c.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) {
    c.src_st.push_back(xs[d] * steps.at(d));
    c.src_base += starts.at(d) * xs[d];
  }
  c.esize = dtype_size(x.dtype);
  return copy_kernel(c);
}

// The bytes of `v` as one element of dtype t (ref::store's rounding).
std::vector<std::byte> element_of(double v, DType t) {
  std::vector<std::byte> e(static_cast<size_t>(dtype_size(t)));
  store(e.data(), t, 0, v);
  return e;
}

// pad: `lo` elements before, `hi` after and `interior` between neighbours along each dim, all of
// value `value` (default 0); operand index i of dim d lands at lo[d] + i * (interior[d] + 1).
Kernel make_pad(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const TensorType& t = s.out.at(0);
  const Ints& lo = s.attrs.ints("lo");
  Ints interior = s.attrs.has("interior") ? s.attrs.ints("interior") : Ints(x.shape.size(), 0);
  Ints ts = strides_of(t.shape);
  Copy c;
  c.shape = x.shape;
  c.src_st = strides_of(x.shape);
  for (size_t d = 0; d < x.shape.size(); ++d) {
    c.dst_st.push_back(ts[d] * (interior.at(d) + 1));
    c.dst_base += lo.at(d) * ts[d];
  }
  c.esize = dtype_size(t.dtype);
  auto value = std::make_shared<std::vector<std::byte>>(element_of(s.attrs.f("value", 0.0), t.dtype));
  int64_t n = t.numel();
  return [c = std::move(c), value, n](const void* const* in, void* const* out) {
    std::byte* o = static_cast<std::byte*>(out[0]);
    size_t es = value->size();
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * es, value->data(), es);
    c.run(in[0], out[0]);
  };
}

// concat: the operands side by side along `axis`, in operand order.
Kernel make_concat(const Spec& s) {
  const TensorType& t = s.out.at(0);
  int64_t axis = s.attrs.i("axis");
  if (axis < 0 || axis >= t.rank()) throw InternalError("[ref] concat: axis out of range for " + type_str(t));
  Ints ts = strides_of(t.shape);
  std::vector<Copy> parts;
  int64_t at = 0;
  for (const TensorType& x : s.in) {
    Copy c;
    c.shape = x.shape;
    c.src_st = strides_of(x.shape);
    c.dst_st = ts;
    c.dst_base = at * ts[axis];
    c.esize = dtype_size(t.dtype);
    parts.push_back(std::move(c));
    at += x.shape.at(axis);
  }
  if (at != t.shape[axis]) throw InternalError("[ref] concat: the operands do not add up to " + type_str(t));
  return [parts = std::move(parts)](const void* const* in, void* const* out) {
    for (size_t k = 0; k < parts.size(); ++k) parts[k].run(in[k], out[0]);
  };
}

// local_slice(x, coords): block k of `group` equal blocks of dim `dim`, where k numbers this
// device within the mesh axes `axis_ids` (row-major over those axes, sizes from `mesh`, this
// device's coordinate on mesh axis a is coords[a]). A block number outside [0, group) (coordinates
// that do not fit the mesh) gives zeros rather than a read out of bounds.
Kernel make_local_slice(const Spec& s) {
  const TensorType& x = s.in.at(0);
  const TensorType& t = s.out.at(0);
  int64_t dim = s.attrs.i("dim");
  int64_t group = s.attrs.i("group");
  Ints axis_ids = s.attrs.ints("axis_ids"), mesh = s.attrs.ints("mesh");
  int64_t ncoords = s.in.at(1).numel();
  for (int64_t a : axis_ids)
    if (a < 0 || a >= static_cast<int64_t>(mesh.size()) || a >= ncoords)
      throw InternalError("[ref] local_slice: mesh axis " + std::to_string(a) + " out of range");
  if (dim < 0 || dim >= x.rank() || group < 1 || t.shape[dim] * group != x.shape[dim])
    throw InternalError("[ref] local_slice of " + type_str(x) + " to " + type_str(t));
  Ints xs = strides_of(x.shape);
  Copy c;
  c.shape = t.shape;
  c.src_st = xs;
  c.dst_st = strides_of(t.shape);
  c.esize = dtype_size(x.dtype);
  int64_t block = t.shape[dim] * xs[dim];  // elements between the starts of neighbouring blocks
  size_t bytes = static_cast<size_t>(t.nbytes());
  return [=](const void* const* in, void* const* out) {
    const int32_t* coords = static_cast<const int32_t*>(in[1]);
    int64_t k = 0;
    for (int64_t a : axis_ids) k = k * mesh[a] + coords[a];
    if (k < 0 || k >= group) {
      if (bytes) std::memset(out[0], 0, bytes);
      return;
    }
    c.run(in[0], out[0], k * block);
  };
}

}  // namespace

void register_shape_kernels() {
  register_kernel(prims::reshape(), make_reshape);
  register_kernel(prims::transpose(), make_transpose);
  register_kernel(prims::broadcast_in_dim(), make_broadcast);
  register_kernel(prims::slice(), make_slice);
  register_kernel(prims::pad(), make_pad);
  register_kernel(prims::concat(), make_concat);
  register_late_kernel(prims::sharding_constraint_if_registered, make_memcpy);
  register_late_kernel(prims::local_slice_if_registered, make_local_slice);
}

}  // namespace px::ref
