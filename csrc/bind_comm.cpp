// Python face of the C++ collectives: proves that a torch.distributed ProcessGroup created in Python
// reaches C++ intact, and gives tests a C++ collective to call.
#include <torch/csrc/utils/pybind.h>

#include "comm/collectives.h"

namespace py = pybind11;

namespace hybrid {

void bind_comm(py::module_& m, py::module_& testing) {
  testing.def(
      "all_reduce_sum",
      [](at::Tensor tensor, const GroupPtr& group) {
        all_reduce_sum(tensor, group);
        return tensor;
      },
      py::arg("tensor"), py::arg("group"), py::call_guard<py::gil_scoped_release>(),
      "In-place sum of `tensor` over `group` (a torch.distributed ProcessGroup), done in C++; returns it.");
  m.def(
      "group_rank_and_size",
      [](const GroupPtr& group) { return py::make_tuple(group->getRank(), group->getSize()); },
      py::arg("group"), "(rank within the group, group size) as C++ sees them.");
}

}  // namespace hybrid
