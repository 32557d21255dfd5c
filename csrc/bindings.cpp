// The only PYBIND11_MODULE: hybrid_engine._C. Each concept binds itself in csrc/bind_<concept>.cpp;
// this file lists them, in dependency order.
#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace hybrid {
void bind_grid(py::module_& m);
void bind_comm(py::module_& m, py::module_& testing);
void bind_schedule(py::module_& m);
void bind_grad(py::module_& m);
void bind_amp(py::module_& m, py::module_& testing);
void bind_executor(py::module_& m);
}  // namespace hybrid

PYBIND11_MODULE(_C, m) {
  m.doc() = "hybrid_engine C++ core: process grid, pipeline schedules, executor, loss scaler, TP autograd";
  // What this module was compiled against (CMakeLists.txt); hybrid_engine/__init__.py checks the same facts from
  // _build_info.py before loading the module, where a mismatch would be an undefined symbol.
  m.attr("built_with_torch") = HYBRID_TORCH_VERSION;
  m.attr("built_with_cuda") = HYBRID_CUDA_VERSION;
  // Bindings that only tests use live in hybrid_engine._C._testing, out of the product's namespace.
  py::module_ testing = m.def_submodule("_testing", "C++ entry points for tests only");
  hybrid::bind_grid(m);
  hybrid::bind_comm(m, testing);
  hybrid::bind_schedule(m);
  hybrid::bind_grad(m);
  hybrid::bind_amp(m, testing);
  hybrid::bind_executor(m);
}
