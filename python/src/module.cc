// parallax._core: the module, its exception types and the dtype enum.
#include <string>

#include <nanobind/stl/string.h>

#include "bind.h"

namespace pxpy {
namespace {

PyObject* g_error = nullptr;       // parallax.Error(RuntimeError): any px::Error
PyObject* g_user_error = nullptr;  // parallax.UserError(Error, ValueError): bad input
PyObject* g_io_error = nullptr;    // parallax.IoError(Error, OSError): files, the OS
PyObject* g_internal = nullptr;    // parallax.InternalError(Error): a bug in the library

PyObject* new_error(nb::module_& m, const char* name, PyObject* bases, const char* doc) {
  std::string qual = std::string("parallax.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qual.c_str(), doc, bases, nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::handle(t);
  return t;
}

}  // namespace

PyObject* user_error_type() { return g_user_error; }

void throw_user(const std::string& msg) { throw px::UserError(msg); }

}  // namespace pxpy

NB_MODULE(_core, m) {
  using namespace pxpy;
  m.attr("__version__") = PX_PY_VERSION;

  g_error = new_error(m, "Error", PyExc_RuntimeError, "Every error Parallax raises; the message is the C++ one.");
  nb::object user_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_ValueError));
  g_user_error = new_error(m, "UserError", user_bases.ptr(), "Bad input: shapes, dtypes, configs, options.");
  nb::object io_bases = nb::make_tuple(nb::handle(g_error), nb::handle(PyExc_OSError));
  g_io_error = new_error(m, "IoError", io_bases.ptr(), "A file or the operating system failed.");
  g_internal = new_error(m, "InternalError", g_error, "A broken invariant inside the library (a bug).");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const px::UserError& e) {
      PyErr_SetString(g_user_error, e.what());
    } catch (const px::IoError& e) {
      PyErr_SetString(g_io_error, e.what());
    } catch (const px::InternalError& e) {
      PyErr_SetString(g_internal, e.what());
    } catch (const px::Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });

  nb::enum_<px::DType>(m, "DType", "Element types: f32, bf16, f16, i32, bool.")
      .value("f32", px::DType::f32)
      .value("bf16", px::DType::bf16)
      .value("f16", px::DType::f16)
      .value("i32", px::DType::i32)
      .value("bool", px::DType::boolean);
  m.def("dtype_name", [](px::DType d) { return std::string(px::dtype_name(d)); });
  m.def("dtype_size", &px::dtype_size);

  bind_array(m);
  bind_trace(m);
  bind_testing(m);
  bind_train(m);
  bind_pax(m);
  bind_pretrained(m);
}
