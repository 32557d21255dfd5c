// Python face of the tensor-parallel autograd functions and the deferrable linear.
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "tp/linear.h"
#include "tp/mp_region.h"

namespace py = pybind11;

namespace hybrid {

void bind_tp(py::module_& m) {
  struct Region {
    const char* name;
    at::Tensor (*fn)(const at::Tensor&, const GroupPtr&);
    const char* doc;
  };
  const Region regions[] = {
      {"copy_to_mp_region", &copy_to_mp_region,
       "Megatron f: identity forward, all-reduce(sum) of the gradient over `group` backward. None or a group of "
       "one: identity."},
      {"reduce_from_mp_region", &reduce_from_mp_region,
       "Megatron g: all-reduce(sum) over `group` forward, identity backward."},
      {"gather_from_mp_region", &gather_from_mp_region,
       "All-gather along the last dim forward (rank order); backward keeps this rank's slice of the gradient."},
  };
  for (const Region& region : regions) {
    auto fn = region.fn;
    m.def(
        region.name,
        [fn](const at::Tensor& x, const std::optional<GroupPtr>& group) { return fn(x, group_or_null(group)); },
        py::arg("x"), py::arg("group"), py::call_guard<py::gil_scoped_release>(), region.doc);
  }
  m.def(
      "linear",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const std::optional<GradBufferPtr>& grads) { return linear(x, weight, bias, grads.value_or(GradBufferPtr())); },
      py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("grads") = py::none(),
      py::call_guard<py::gil_scoped_release>(),
        "x @ weight.T + bias. With `grads` (the engine's GradBuffer) the weight gradient goes where it routes it: "
        "stashed while it defers (zero-bubble W), else into the weight's fp32 main grad when it has one.");
}

}  // namespace hybrid
