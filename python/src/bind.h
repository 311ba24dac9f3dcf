// Shared declarations of the parallax._core extension: each source binds one part of the API.
#pragma once

#include <nanobind/nanobind.h>

#include "parallax/core.h"

namespace nb = nanobind;

namespace pxpy {

void bind_array(nb::module_& m);
void bind_trace(nb::module_& m);
void bind_testing(nb::module_& m);
void bind_train(nb::module_& m);
void bind_pax(nb::module_& m);
void bind_pretrained(nb::module_& m);

// The exception types of the package (parallax.Error and its subclasses), made in module.cc.
PyObject* user_error_type();

// Raises parallax.UserError (a ValueError) with `msg`.
[[noreturn]] void throw_user(const std::string& msg);

}  // namespace pxpy
