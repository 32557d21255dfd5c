// Python face of the tensor-parallel autograd functions and the deferrable linear.
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "tp/linear.h"
#include "tp/mp_region.h"
#include "tp/parallel_linear.h"
#include "tp/sequence_region.h"

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
      {"gather_along_sequence", &gather_along_sequence,
       "Sequence parallel: [b, s/p, ...] chunks -> [b, s, ...] on every rank (rank order); backward sums the "
       "gradient over `group` and keeps this rank's chunk. None or a group of one: identity."},
      {"reduce_scatter_along_sequence", &reduce_scatter_along_sequence,
       "Sequence parallel: [b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum over `group`; "
       "backward all-gathers along dim 1."},
      {"scatter_along_sequence", &scatter_along_sequence,
       "Sequence parallel: a [b, s, ...] tensor replicated over `group` -> this rank's chunk of dim 1; backward "
       "all-gathers along dim 1."},
  };
  for (const Region& region : regions) {
    auto fn = region.fn;
    m.def(
        region.name,
        [fn](const at::Tensor& x, const std::optional<GroupPtr>& group) { return fn(x, group_or_null(group)); },
        py::arg("x"), py::arg("group"), py::call_guard<py::gil_scoped_release>(), region.doc);
  }
  m.def("sequence_to_slabs", &sequence_to_slabs, py::arg("x"), py::arg("parts"),
        "[b, s, ...] -> [p, b, s/p, ...], contiguous: rank r's sequence chunk is the r-th slab, the layout the flat "
        "collectives read and write.");
  m.def("sequence_from_slabs", &sequence_from_slabs, py::arg("slabs"),
        "[p, b, s/p, ...] -> [b, s, ...], the inverse of sequence_to_slabs.");
  m.def(
      "linear",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const std::optional<GradBufferPtr>& grads) { return linear(x, weight, bias, grads.value_or(GradBufferPtr())); },
      py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(), py::arg("grads") = py::none(),
      py::call_guard<py::gil_scoped_release>(),
        "x @ weight.T + bias. With `grads` (the engine's GradBuffer) the weight gradient goes where it routes it: "
        "stashed while it defers (zero-bubble W), else into the weight's fp32 main grad when it has one.");
  m.def(
      "column_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
         const std::optional<GradBufferPtr>& grads, const std::optional<GroupPtr>& group, bool sequence_parallel,
         std::shared_ptr<CommTrace> trace, int64_t layer) {
        return column_parallel_linear(x, weight, bias, grads.value_or(GradBufferPtr()), group_or_null(group),
                                      sequence_parallel, trace, layer);
      },
      py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("grads"), py::arg("group"),
      py::arg("sequence_parallel") = false, py::arg("trace") = nullptr, py::arg("layer") = 0,
      py::call_guard<py::gil_scoped_release>(),
      "Megatron's column-parallel linear: (sequence parallel: all-gather x along dim 1) then x @ weight.T + bias "
      "on this rank's output slice; backward all-reduces (reduce-scatters) the input gradient while the weight "
      "gradient's GEMM runs.");
  m.def(
      "row_parallel_linear",
      [](const at::Tensor& x, const at::Tensor& weight, const std::optional<GradBufferPtr>& grads,
         const std::optional<GroupPtr>& group, bool sequence_parallel, std::shared_ptr<CommTrace> trace,
         int64_t layer) {
        return row_parallel_linear(x, weight, grads.value_or(GradBufferPtr()), group_or_null(group),
                                   sequence_parallel, trace, layer);
      },
      py::arg("x"), py::arg("weight"), py::arg("grads"), py::arg("group"), py::arg("sequence_parallel") = false,
      py::arg("trace") = nullptr, py::arg("layer") = 0, py::call_guard<py::gil_scoped_release>(),
      "Megatron's row-parallel linear without its bias: x @ weight.T on this rank's input slice, summed over "
      "`group` (sequence parallel: reduce-scattered along dim 1); the caller adds the bias after the sum.");
}

}  // namespace hybrid
