// Shared declarations of the extension's source files: each file binds one part of the API.
#pragma once

#include <nanobind/nanobind.h>

namespace flashtq::python {

void bind_views(nanobind::module_& m);
void bind_dense(nanobind::module_& m);
void bind_tq_cache(nanobind::module_& m);
void bind_tq_paged_cache(nanobind::module_& m);

}  // namespace flashtq::python
