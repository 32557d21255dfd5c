// Python face of the tensor-parallel autograd functions, the deferrable linear and the weight-gradient store.
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <tuple>
#include <vector>

#include "tp/linear.h"
#include "tp/linear_chain.h"
#include "tp/mp_region.h"
#include "tp/main_grad.h"
#include "tp/weight_grad_store.h"

namespace py = pybind11;

namespace hybrid {

namespace {

// None (no model parallelism) arrives as nullopt and becomes the null group every region treats as trivial.
GroupPtr group_or_null(const std::optional<GroupPtr>& group) { return group.value_or(GroupPtr()); }

std::vector<WgradKey> to_keys(const std::vector<std::tuple<int, int>>& pairs) {
  std::vector<WgradKey> keys;
  for (const auto& [stage, micro] : pairs) keys.push_back({stage, micro});
  return keys;
}

}  // namespace

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
  m.def("linear", &linear, py::arg("x"), py::arg("weight"), py::arg("bias") = py::none(),
        py::call_guard<py::gil_scoped_release>(),
        "x @ weight.T + bias with a weight gradient that wgrad_set_defer(True) postpones to a wgrad_flush.");

  // Module-level controls of the process-wide WeightGradStore.
  m.def("wgrad_set_defer", [](bool defer) { WeightGradStore::instance().set_defer(defer); }, py::arg("defer"));
  m.def("wgrad_defer", []() { return WeightGradStore::instance().defer(); });
  m.def("wgrad_begin", [](int stage, int micro) { WeightGradStore::instance().begin({stage, micro}); },
        py::arg("stage"), py::arg("micro"), "Label the weight gradients the next backward stashes.");
  m.def("wgrad_end", []() { WeightGradStore::instance().end(); });
  m.def("wgrad_flush", [](int stage, int micro) { return WeightGradStore::instance().flush({stage, micro}); },
        py::arg("stage"), py::arg("micro"), py::call_guard<py::gil_scoped_release>(),
        "Accumulate the stashed weight gradients of (stage, micro) into .grad; returns the parameters updated.");
  m.def(
      "wgrad_flush_merged",
      [](const std::vector<std::tuple<int, int>>& keys) {
        return WeightGradStore::instance().flush_merged(to_keys(keys));
      },
      py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
      "Flush several (stage, micro) keys with one GEMM per parameter (rows concatenated).");
  m.def("wgrad_flush_all", []() { return WeightGradStore::instance().flush_all(); },
        py::call_guard<py::gil_scoped_release>());
  m.def("wgrad_pending", []() { return WeightGradStore::instance().pending(); }, "Stashed entries, all keys.");
  m.def(
      "linear_chain",
      [](const at::Tensor& x, const std::vector<std::optional<at::Tensor>>& params, const std::vector<bool>& relu,
         bool recompute) {
        std::vector<at::Tensor> tensors;
        for (const auto& p : params) tensors.push_back(p.has_value() ? *p : at::Tensor());
        return linear_chain(x, tensors, relu, recompute);
      },
      py::arg("x"), py::arg("params"), py::arg("relu"), py::arg("recompute") = false,
      "A stage of Linear(+ReLU) layers as one autograd node: params = [w0, b0 or None, w1, ...].");
  m.def("set_main_grad", &set_main_grad, py::arg("param"), py::arg("buffer"),
        "Accumulate `param`'s gradient into `buffer` (e.g. fp32 for a half weight) instead of param.grad.");
  m.def("clear_main_grads", &clear_main_grads);
  m.def("wgrad_clear", []() { WeightGradStore::instance().clear(); },
        "Drop every stash uncomputed and leave defer mode.");
}

}  // namespace hybrid
