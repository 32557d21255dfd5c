// Python face of the torch-free ProcessGrid.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <sstream>

#include "grid/process_grid.h"

namespace py = pybind11;

namespace hybrid {

namespace {

// One axis ("tp", "mp", ...) or several, as a list or joined by '-' ("dp-cp"): the first listed varies fastest.
std::vector<Axis> parse_axes(const py::object& spec) {
  std::vector<Axis> axes;
  if (py::isinstance<py::str>(spec)) {
    std::string text = spec.cast<std::string>(), name;
    std::istringstream in(text);
    while (std::getline(in, name, '-')) axes.push_back(parse_axis(name));
  } else {
    for (const auto& item : spec) axes.push_back(parse_axis(item.cast<std::string>()));
  }
  if (axes.empty()) throw std::invalid_argument("no axis named (expected e.g. 'dp' or 'dp-cp')");
  return axes;
}

}  // namespace

void bind_grid(py::module_& m) {
  py::enum_<Axis>(m, "Axis")
      .value("DP", Axis::DP)
      .value("CP", Axis::CP)
      .value("PP", Axis::PP)
      .value("TP", Axis::TP)
      .value("MP", Axis::MP)
      .value("EP", Axis::EP);

  py::class_<GridCoord>(m, "GridCoord")
      .def_readonly("dp", &GridCoord::dp)
      .def_readonly("pp", &GridCoord::pp)
      .def_readonly("mp", &GridCoord::mp)
      .def_readonly("tp", &GridCoord::mp)
      .def_readonly("cp", &GridCoord::cp)
      .def_readonly("ep", &GridCoord::ep)
      .def("get", [](const GridCoord& c, const std::string& axis) { return c.get(parse_axis(axis)); }, py::arg("axis"))
      // (dp, pp, mp): the course's three axes; cp and ep are read by name.
      .def("__iter__", [](const GridCoord& c) { return py::iter(py::make_tuple(c.dp, c.pp, c.mp)); })
      .def("__eq__", &GridCoord::operator==)
      .def("__repr__", [](const GridCoord& c) {
        std::string text = "GridCoord(dp=" + std::to_string(c.dp) + ", pp=" + std::to_string(c.pp) +
                           ", mp=" + std::to_string(c.mp);
        if (c.cp) text += ", cp=" + std::to_string(c.cp);
        if (c.ep) text += ", ep=" + std::to_string(c.ep);
        return text + ")";
      });

  py::class_<ProcessGrid>(m, "ProcessGrid",
                          "A mesh of named axes (dp, cp, pp, tp alias mp, ep) over the ranks. `order` names axes "
                          "fastest-varying first (csrc/grid/process_grid.h).")
      .def(py::init<int, int, int, const std::string&, int, int>(), py::arg("dp"), py::arg("pp"), py::arg("mp"),
           py::arg("order") = ProcessGrid::kDefaultOrder, py::kw_only(), py::arg("cp") = 1, py::arg("ep") = 1)
      .def_property_readonly("dp_size", &ProcessGrid::dp_size)
      .def_property_readonly("pp_size", &ProcessGrid::pp_size)
      .def_property_readonly("mp_size", &ProcessGrid::mp_size)
      .def_property_readonly("tp_size", &ProcessGrid::mp_size)
      .def_property_readonly("cp_size", &ProcessGrid::cp_size)
      .def_property_readonly("ep_size", &ProcessGrid::ep_size)
      .def_property_readonly("world_size", &ProcessGrid::world_size)
      .def_property_readonly("order", &ProcessGrid::order)
      .def_property_readonly(
          "axes",
          [](const ProcessGrid& g) {
            std::vector<std::string> names;
            for (Axis axis : g.axes()) names.push_back(axis_name(axis));
            return names;
          },
          "Every axis, fastest- to slowest-varying ('tp' for mp).")
      .def("size", [](const ProcessGrid& g, const std::string& axis) { return g.size(parse_axis(axis)); },
           py::arg("axis"))
      .def("stride", [](const ProcessGrid& g, const std::string& axis) { return g.stride(parse_axis(axis)); },
           py::arg("axis"), "How far apart two ranks one step along the axis are (1: adjacent ranks).")
      .def("check_world_size", &ProcessGrid::check_world_size, py::arg("world_size"))
      .def("coords", &ProcessGrid::coords, py::arg("rank"))
      .def(
          "rank_of",
          [](const ProcessGrid& g, int dp, int pp, int mp, int cp, int ep) {
            GridCoord c;
            c.dp = dp, c.pp = pp, c.mp = mp, c.cp = cp, c.ep = ep;
            return g.rank_of(c);
          },
          py::arg("dp"), py::arg("pp"), py::arg("mp"), py::kw_only(), py::arg("cp") = 0, py::arg("ep") = 0)
      .def("groups", [](const ProcessGrid& g, const py::object& axes) { return g.groups(parse_axes(axes)); },
           py::arg("axes"),
           "All groups along one axis ('dp', 'pp', 'mp', ...) or several ('dp-cp' or ['dp', 'cp']), each ordered by "
           "those coordinates, the first axis fastest.")
      .def("group_of",
           [](const ProcessGrid& g, int rank, const py::object& axes) { return g.group_of(rank, parse_axes(axes)); },
           py::arg("rank"), py::arg("axes"))
      .def("model_parallel_groups", &ProcessGrid::model_parallel_groups)
      .def("model_parallel_group_of", &ProcessGrid::model_parallel_group_of, py::arg("rank"))
      .def("pp_prev", &ProcessGrid::pp_prev, py::arg("rank"))
      .def("pp_next", &ProcessGrid::pp_next, py::arg("rank"))
      .def("__repr__", [](const ProcessGrid& g) {
        std::string text = "ProcessGrid(dp=" + std::to_string(g.dp_size()) + ", pp=" + std::to_string(g.pp_size()) +
                           ", mp=" + std::to_string(g.mp_size()) + ", order='" + g.order() + "'";
        if (g.cp_size() > 1) text += ", cp=" + std::to_string(g.cp_size());
        if (g.ep_size() > 1) text += ", ep=" + std::to_string(g.ep_size());
        return text + ")";
      });
}

}  // namespace hybrid
