// px.Array: host arrays to and from NumPy (the buffer protocol) and DLPack, without copies where
// the memory allows.
//
// Out of Parallax nothing is copied: a NumPy array or a DLPack consumer views the Array's buffer
// and holds it alive. Into Parallax, memory that is a px::Array's comes back as that Array; other
// contiguous CPU memory aligned to its element size is adopted (px::Array::adopt: the Array holds
// the NumPy buffer or the DLPack tensor until its last user is gone); anything else is copied (see
// docs/python.md).
#include <cstring>
#include <string>
#include <vector>

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bind.h"

namespace pxpy {
namespace {

// ---- DLPack (the stable C ABI of dlpack.h, v0.8 legacy capsules) ----------------------------
struct DLDevice {
  int32_t device_type;  // 1: CPU
  int32_t device_id;
};
struct DLDataType {
  uint8_t code;  // 0 int, 1 uint, 2 float, 4 bfloat, 6 bool
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: compact row-major
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

constexpr int32_t kDLCPU = 1;

// Owners of adopted memory are let go of with the GIL held, from whichever thread drops the last
// Array; after the interpreter has shut down they are left alone (the process is ending).
bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// Owns a buffer-protocol export (a NumPy array stays alive, and unresizable, while it is held).
std::shared_ptr<void> buffer_owner(Py_buffer* view) {
  return std::shared_ptr<void>(view, [](void* p) {
    auto* v = static_cast<Py_buffer*>(p);
    if (python_alive()) {
      nb::gil_scoped_acquire gil;
      PyBuffer_Release(v);
    }
    delete v;
  });
}

// What an exported capsule owns: a handle on the Array's buffer and the shape.
struct Export {
  DLManagedTensor managed{};
  px::Array array;
  std::vector<int64_t> shape;
};

void export_deleter(DLManagedTensor* t) { delete static_cast<Export*>(t->manager_ctx); }

void capsule_destructor(PyObject* cap) {
  // Only a capsule nobody consumed still owns its tensor.
  if (PyCapsule_IsValid(cap, "dltensor")) {
    auto* t = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap, "dltensor"));
    if (t && t->deleter) t->deleter(t);
  } else {
    PyErr_Clear();
  }
}

DLDataType dl_dtype(px::DType d) {
  switch (d) {
    case px::DType::f32:
      return {2, 32, 1};
    case px::DType::bf16:
      return {4, 16, 1};
    case px::DType::f16:
      return {2, 16, 1};
    case px::DType::i32:
      return {0, 32, 1};
    case px::DType::boolean:
      return {6, 8, 1};
  }
  return {2, 32, 1};
}

px::DType from_dl_dtype(const DLDataType& t) {
  if (t.lanes == 1) {
    if (t.code == 2 && t.bits == 32) return px::DType::f32;
    if (t.code == 4 && t.bits == 16) return px::DType::bf16;
    if (t.code == 2 && t.bits == 16) return px::DType::f16;
    if (t.code == 0 && t.bits == 32) return px::DType::i32;
    if (t.code == 6 && t.bits == 8) return px::DType::boolean;
  }
  throw px::UserError("px.from_dlpack: unsupported dtype (DLPack code " + std::to_string(t.code) + ", " +
                      std::to_string(t.bits) + " bits, " + std::to_string(t.lanes) +
                      " lanes); Parallax takes float32, bfloat16, float16, int32 and bool");
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// True when `strides` (in elements) describe the compact row-major layout of `shape`.
bool row_major(const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t expect = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (shape[i] != 1 && strides[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

nb::capsule to_dlpack(const px::Array& a) {
  auto* e = new Export;
  e->array = a.on_host();  // device memory the host cannot read: exported as a host copy
  e->shape = a.shape();
  DLTensor& t = e->managed.dl_tensor;
  t.data = const_cast<void*>(e->array.raw());
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int32_t>(e->shape.size());
  t.dtype = dl_dtype(a.dtype());
  t.shape = e->shape.data();
  t.strides = nullptr;
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = export_deleter;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete e;
    throw nb::python_error();
  }
  return nb::steal<nb::capsule>(cap);
}

// Takes a legacy DLPack capsule: a px::Array's own export comes back as that Array; other CPU
// memory (row-major) is adopted when `adopt` and aligned to its element size, else copied.
px::Array from_dlpack_capsule(nb::handle cap, nb::handle owner_of, bool adopt) {
  if (!PyCapsule_IsValid(cap.ptr(), "dltensor"))
    throw_user("px.from_dlpack: expected an unconsumed 'dltensor' capsule (from __dlpack__())");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  const DLTensor& t = m->dl_tensor;
  // Consumed from here on: `keep` runs the deleter when the last Array adopting the memory is gone,
  // or when this function ends without adopting it, whatever happens.
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  std::shared_ptr<void> keep(m, [](void* p) {
    auto* mt = static_cast<DLManagedTensor*>(p);
    if (mt->deleter && python_alive()) {
      nb::gil_scoped_acquire gil;
      mt->deleter(mt);
    }
  });

  if (t.device.device_type != kDLCPU)
    throw_user("px.from_dlpack: the tensor is on DLPack device type " + std::to_string(t.device.device_type) +
               "; Parallax takes CPU memory (device type 1)");
  px::DType dtype = from_dl_dtype(t.dtype);
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (t.strides) {
    std::vector<int64_t> strides(t.strides, t.strides + t.ndim);
    if (!row_major(shape, strides))
      throw_user("px.from_dlpack: the tensor is not contiguous (shape " + shape_text(shape) + ", strides " +
                 shape_text(strides) +
                 " in elements); make a contiguous copy first (.contiguous(), "
                 "np.ascontiguousarray)");
  }
  if (m->deleter == export_deleter) {
    const px::Array& own = static_cast<Export*>(m->manager_ctx)->array;
    if (t.byte_offset == 0 && t.data == own.raw()) return own.reshape(shape);
  }
  const char* data = static_cast<const char*>(t.data) + t.byte_offset;
  const int64_t nbytes = px::checked_nbytes(px::numel(shape), dtype, "px.from_dlpack");
  // Memory a live px.Array exported through another library (px -> torch -> px) comes back as is.
  if (!owner_of.is_none()) {
    nb::object found = owner_of(reinterpret_cast<uintptr_t>(data));
    if (!found.is_none()) {
      const px::Array& own = nb::cast<const px::Array&>(found);
      if (own.dtype() == dtype && own.nbytes() == nbytes) return own.reshape(shape);
    }
  }
  if (adopt && nbytes > 0 && px::Array::adoptable(data, dtype))
    return px::Array::adopt(const_cast<char*>(data), {dtype, shape}, std::move(keep));
  px::Array out(dtype, shape);
  if (nbytes > 0) std::memcpy(out.raw(), data, out.nbytes());
  return out;
}

// ---- buffer protocol -------------------------------------------------------------------------
const char* buffer_format(px::DType d) {
  switch (d) {
    case px::DType::f32:
      return "f";
    case px::DType::f16:
      return "e";
    case px::DType::i32:
      return "i";
    case px::DType::boolean:
      return "?";
    case px::DType::bf16:
      return nullptr;  // no PEP 3118 code: exported by view_bytes() and viewed as bfloat16
  }
  return nullptr;
}

// Shape and strides of an exported buffer, freed by releasebuffer.
struct BufferInfo {
  std::vector<Py_ssize_t> shape, strides;
  px::Array host;  // what the view shows: the array itself, or its host copy when the host cannot read it
};

int fill_buffer(PyObject* owner, const px::Array& a, Py_buffer* view, int flags, bool as_bytes) {
  const char* fmt = as_bytes ? "B" : buffer_format(a.dtype());
  if (!fmt) {
    PyErr_SetString(PyExc_BufferError,
                    "px.Array: bf16 has no buffer-protocol format; use np.asarray(a) (ml_dtypes.bfloat16) or "
                    "a.view_bytes()");
    view->obj = nullptr;
    return -1;
  }
  if (a.read_only() && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError,
                    "px.Array: the array is read-only (it adopted a read-only NumPy array's memory); a writable "
                    "view needs a copy: a.copy()");
    view->obj = nullptr;
    return -1;
  }
  const bool copied = !px::host_visible(a.placement());
  if (copied && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
    PyErr_SetString(PyExc_BufferError,
                    ("px.Array: the array is in " + a.placement().to_string() +
                     " memory, which the host cannot write through a view; take a host copy: a.to_host()")
                        .c_str());
    view->obj = nullptr;
    return -1;
  }
  auto* info = new BufferInfo;
  info->host = a.on_host();
  if (as_bytes) {
    info->shape = {static_cast<Py_ssize_t>(a.nbytes())};
    info->strides = {1};
  } else {
    Py_ssize_t stride = static_cast<Py_ssize_t>(px::dtype_size(a.dtype()));
    info->shape.assign(a.shape().begin(), a.shape().end());
    info->strides.resize(info->shape.size());
    for (int i = static_cast<int>(info->shape.size()) - 1; i >= 0; --i) {
      info->strides[i] = stride;
      stride *= info->shape[i];
    }
  }
  view->buf = const_cast<void*>(info->host.raw());
  view->obj = owner;
  Py_INCREF(owner);
  view->len = static_cast<Py_ssize_t>(a.nbytes());
  view->readonly = a.read_only() || copied ? 1 : 0;
  view->itemsize = as_bytes ? 1 : static_cast<Py_ssize_t>(px::dtype_size(a.dtype()));
  view->format = (flags & PyBUF_FORMAT) ? const_cast<char*>(fmt) : nullptr;
  view->ndim = static_cast<int>(info->shape.size());
  view->shape = (flags & PyBUF_ND) ? info->shape.data() : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? info->strides.data() : nullptr;
  view->suboffsets = nullptr;
  view->internal = info;
  return 0;
}

void release_buffer(PyObject*, Py_buffer* view) { delete static_cast<BufferInfo*>(view->internal); }

int array_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  return fill_buffer(self, *nb::inst_ptr<px::Array>(self), view, flags, false);
}

// The bytes of an Array as a 1-D uint8 buffer that holds the Array's buffer alive (any dtype).
struct Bytes {
  px::Array array;
};

int bytes_getbuffer(PyObject* self, Py_buffer* view, int flags) {
  return fill_buffer(self, nb::inst_ptr<Bytes>(self)->array, view, flags, true);
}

PyType_Slot array_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(array_getbuffer)},
                             {Py_bf_releasebuffer, reinterpret_cast<void*>(release_buffer)},
                             {0, nullptr}};
PyType_Slot bytes_slots[] = {{Py_bf_getbuffer, reinterpret_cast<void*>(bytes_getbuffer)},
                             {Py_bf_releasebuffer, reinterpret_cast<void*>(release_buffer)},
                             {0, nullptr}};

// A C-contiguous buffer (anything with the buffer protocol) as an Array of `dtype`: adopted (no
// copy; read-only when the buffer is) when `adopt` and aligned to the element size, else copied.
px::Array from_buffer(nb::handle obj, px::DType dtype, bool adopt) {
  auto* held = new Py_buffer;
  if (PyObject_GetBuffer(obj.ptr(), held, PyBUF_RECORDS_RO) != 0) {
    delete held;
    throw nb::python_error();
  }
  std::shared_ptr<void> keep = buffer_owner(held);  // released when this function or the Array lets go
  const Py_buffer& view = *held;
  std::vector<int64_t> shape(view.shape, view.shape + view.ndim);
  if (view.itemsize != px::dtype_size(dtype))
    throw_user(std::string("px.asarray: the buffer's items are ") + std::to_string(view.itemsize) + " bytes, " +
               px::dtype_name(dtype) + " takes " + std::to_string(px::dtype_size(dtype)));
  if (!PyBuffer_IsContiguous(&view, 'C')) {
    std::vector<int64_t> strides(view.strides, view.strides + view.ndim);
    throw_user("px.asarray: the array is not C-contiguous (shape " + shape_text(shape) + ", strides " +
               shape_text(strides) + " in bytes); pass np.ascontiguousarray(x) to copy it");
  }
  if (adopt && view.len > 0 && px::Array::adoptable(view.buf, dtype))
    return px::Array::adopt(view.buf, {dtype, shape}, std::move(keep), view.readonly != 0);
  px::Array out(dtype, shape);
  if (out.nbytes() > 0) std::memcpy(out.raw(), view.buf, out.nbytes());
  return out;
}

}  // namespace

void bind_array(nb::module_& m) {
  nb::class_<Bytes>(m, "_Bytes", nb::type_slots(bytes_slots)).def_prop_ro("array", [](const Bytes& b) {
    return b.array;
  });

  nb::class_<px::Array>(m, "Array", nb::type_slots(array_slots), nb::is_weak_referenceable(),
                        "A dense, row-major host array (px::Array). Copies share the buffer.")
      .def(
          "__init__",
          [](px::Array* self, nb::handle obj, nb::handle dtype, nb::handle copy) {
            nb::object a = nb::module_::import_("parallax._array").attr("asarray")(obj, dtype, nb::arg("copy") = copy);
            new (self) px::Array(nb::cast<const px::Array&>(a));
          },
          nb::arg("obj"), nb::arg("dtype") = nb::none(), nb::kw_only(), nb::arg("copy") = nb::none(),
          "px.asarray(obj, dtype, copy=copy) as a constructor: NumPy and DLPack memory without a copy where the "
          "layout allows.")
      .def_static(
          "zeros", [](const std::vector<int64_t>& shape, px::DType d) { return px::Array::zeros(d, shape); },
          nb::arg("shape"), nb::arg("dtype") = px::DType::f32)
      .def_static("_from_buffer", &from_buffer, nb::arg("obj"), nb::arg("dtype"), nb::arg("adopt") = true)
      .def_static("_from_dlpack_capsule", &from_dlpack_capsule, nb::arg("capsule"), nb::arg("owner_of") = nb::none(),
                  nb::arg("adopt") = true)
      .def_prop_ro("adopted", &px::Array::adopted,
                   "True when the memory is another library's (a NumPy array or a DLPack tensor adopted without a "
                   "copy).")
      .def_prop_ro("read_only", &px::Array::read_only,
                   "True when the memory is a read-only NumPy array's: Parallax never writes into it.")
      .def_prop_ro("dtype", &px::Array::dtype)
      .def_prop_ro("shape", [](const px::Array& a) { return nb::tuple(nb::cast(a.shape())); })
      .def_prop_ro("ndim", [](const px::Array& a) { return a.shape().size(); })
      .def_prop_ro("size", &px::Array::numel)
      .def_prop_ro("nbytes", &px::Array::nbytes)
      .def_prop_ro(
          "data_ptr", [](const px::Array& a) { return reinterpret_cast<uintptr_t>(a.raw()); },
          "The address of the first element (equal for arrays that share memory).")
      .def(
          "view_bytes", [](const px::Array& a) { return Bytes{a}; },
          "The bytes as a 1-D uint8 buffer over the same memory (any dtype).")
      .def("astype", &px::Array::astype, nb::arg("dtype"))
      .def("copy", &px::Array::clone)
      .def(
          "to_host", [](const px::Array& a) { return a.on_host(); },
          "The array in host memory: itself when the host can read its memory (the cpu platform), else a copy "
          "(device memory of an accelerator).")
      .def(
          "reshape", [](const px::Array& a, const std::vector<int64_t>& s) { return a.reshape(s); }, nb::arg("shape"),
          "A view with another shape (same buffer).")
      .def(
          "__dlpack__",
          [](const px::Array& a, nb::handle stream, nb::handle max_version, nb::handle dl_device, nb::handle copy) {
            if (!copy.is_none() && nb::cast<bool>(copy)) return to_dlpack(a.clone());
            if (!copy.is_none() && !px::host_visible(a.placement()))
              throw nb::buffer_error(("px.Array.__dlpack__: the array is in " + a.placement().to_string() +
                                      " memory, which is exported to the host only as a copy; call with copy=None "
                                      "or copy=True")
                                         .c_str());
            // DLPack (legacy capsules) cannot say read-only: the consumer gets a copy it may write.
            if (a.read_only()) {
              if (!copy.is_none())
                throw nb::buffer_error(
                    "px.Array.__dlpack__: the array is read-only (it adopted a read-only NumPy array's memory) "
                    "and DLPack cannot mark it so; call with copy=None or copy=True for a copy");
              return to_dlpack(a.clone());
            }
            return to_dlpack(a);
          },
          nb::arg("stream") = nb::none(), nb::kw_only(), nb::arg("max_version") = nb::none(),
          nb::arg("dl_device") = nb::none(), nb::arg("copy") = nb::none())
      .def("__dlpack_device__", [](const px::Array&) { return nb::make_tuple(kDLCPU, 0); });
}

}  // namespace pxpy
