// Python face of the torch-free ProcessGrid.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "grid/process_grid.h"

namespace py = pybind11;

namespace hybrid {

void bind_grid(py::module_& m) {
  py::enum_<Axis>(m, "Axis").value("DP", Axis::DP).value("PP", Axis::PP).value("MP", Axis::MP);

  py::class_<GridCoord>(m, "GridCoord")
      .def_readonly("dp", &GridCoord::dp)
      .def_readonly("pp", &GridCoord::pp)
      .def_readonly("mp", &GridCoord::mp)
      .def("__iter__", [](const GridCoord& c) { return py::iter(py::make_tuple(c.dp, c.pp, c.mp)); })
      .def("__eq__", &GridCoord::operator==)
      .def("__repr__", [](const GridCoord& c) {
        return "GridCoord(dp=" + std::to_string(c.dp) + ", pp=" + std::to_string(c.pp) +
               ", mp=" + std::to_string(c.mp) + ")";
      });

  auto parse = [](const std::string& name) { return parse_axis(name); };
  py::class_<ProcessGrid>(m, "ProcessGrid",
                          "DP x PP x MP placement of ranks. `order` names axes fastest-varying first.")
      .def(py::init<int, int, int, const std::string&>(), py::arg("dp"), py::arg("pp"), py::arg("mp"),
           py::arg("order") = ProcessGrid::kDefaultOrder)
      .def_property_readonly("dp_size", &ProcessGrid::dp_size)
      .def_property_readonly("pp_size", &ProcessGrid::pp_size)
      .def_property_readonly("mp_size", &ProcessGrid::mp_size)
      .def_property_readonly("world_size", &ProcessGrid::world_size)
      .def_property_readonly("order", &ProcessGrid::order)
      .def("check_world_size", &ProcessGrid::check_world_size, py::arg("world_size"))
      .def("coords", &ProcessGrid::coords, py::arg("rank"))
      .def("rank_of", [](const ProcessGrid& g, int dp, int pp, int mp) { return g.rank_of({dp, pp, mp}); },
           py::arg("dp"), py::arg("pp"), py::arg("mp"))
      .def("groups", [parse](const ProcessGrid& g, const std::string& axis) { return g.groups(parse(axis)); },
           py::arg("axis"), "All groups along axis 'dp', 'pp' or 'mp', each ordered by that coordinate.")
      .def("group_of",
           [parse](const ProcessGrid& g, int rank, const std::string& axis) { return g.group_of(rank, parse(axis)); },
           py::arg("rank"), py::arg("axis"))
      .def("model_parallel_groups", &ProcessGrid::model_parallel_groups)
      .def("model_parallel_group_of", &ProcessGrid::model_parallel_group_of, py::arg("rank"))
      .def("pp_prev", &ProcessGrid::pp_prev, py::arg("rank"))
      .def("pp_next", &ProcessGrid::pp_next, py::arg("rank"))
      .def("__repr__", [](const ProcessGrid& g) {
        return "ProcessGrid(dp=" + std::to_string(g.dp_size()) + ", pp=" + std::to_string(g.pp_size()) +
               ", mp=" + std::to_string(g.mp_size()) + ", order='" + g.order() + "')";
      });
}

}  // namespace hybrid
