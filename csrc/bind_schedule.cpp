// Python face of the torch-free pipeline schedules: hybrid_engine._C.schedule.
// Only pybind11 headers, no torch: this file compiles in seconds.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "schedule/action.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/placement.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

namespace py = pybind11;

namespace hybrid {

namespace {

std::string costs_repr(const Costs& c) {
  auto num = [](double x) { return py::str(py::float_(x)).cast<std::string>(); };
  return "Costs(F=" + num(c.forward) + ", B=" + num(c.backward) + ", I=" + num(c.backward_input) +
         ", W=" + num(c.backward_weight) + ", latency=" + num(c.latency) + ")";
}

StagePlacement placement_of(int pp, int num_stages, const std::string& placement) {
  return StagePlacement(pp, num_stages, parse_placement(placement));
}

}  // namespace

void bind_schedule(py::module_& root) {
  py::module_ m = root.def_submodule(
      "schedule", "Pipeline schedules as data: actions, generators, lowering, validation, simulation.");

  py::enum_<ActionType>(m, "ActionType")
      .value("F", ActionType::F)
      .value("B", ActionType::B)
      .value("I", ActionType::I)
      .value("W", ActionType::W)
      .value("SEND_F", ActionType::SEND_F)
      .value("RECV_F", ActionType::RECV_F)
      .value("SEND_B", ActionType::SEND_B)
      .value("RECV_B", ActionType::RECV_B)
      .def_property_readonly("is_compute", [](ActionType t) { return is_compute(t); })
      .def_property_readonly("is_comm", [](ActionType t) { return is_comm(t); })
      .def_static("parse", &parse_action_type, py::arg("text"));

  // Immutable, so that actions can be dict keys and set members.
  py::class_<Action>(m, "Action", "One step of one rank's pipeline program: (stage, type, micro). Prints as '1F3'.")
      .def(py::init([](int stage, ActionType type, int micro) { return Action{stage, type, micro}; }),
           py::arg("stage"), py::arg("type"), py::arg("micro"))
      .def_readonly("stage", &Action::stage)
      .def_readonly("type", &Action::type)
      .def_readonly("micro", &Action::micro)
      .def_property_readonly("is_compute", [](const Action& a) { return is_compute(a.type); })
      .def_static("parse", &parse_action, py::arg("text"), "Inverse of str(): '1F3' -> Action(1, F, 3).")
      .def("__str__", [](const Action& a) { return to_string(a); })
      .def("__repr__", [](const Action& a) { return to_string(a); })
      .def("__eq__",
           [](const Action& a, const py::object& other) -> py::object {
             if (!py::isinstance<Action>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
             return py::bool_(a == other.cast<const Action&>());
           })
      .def("__hash__",
           [](const Action& a) { return py::hash(py::make_tuple(a.stage, static_cast<int>(a.type), a.micro)); })
      .def(py::pickle([](const Action& a) { return to_string(a); },
                      [](const std::string& text) { return parse_action(text); }));

  py::class_<Costs>(m, "Costs", "Durations of one F, B, I, W (one stage, one micro-batch) and per-message latency.")
      .def(py::init([](double f, double b, double i, double w, double latency) {
             return Costs{f, b, i, w, latency};
           }),
           py::arg("F") = 1.0, py::arg("B") = 2.0, py::arg("I") = 1.0, py::arg("W") = 1.0,
           py::arg("latency") = 0.0)
      .def_readwrite("F", &Costs::forward)
      .def_readwrite("B", &Costs::backward)
      .def_readwrite("I", &Costs::backward_input)
      .def_readwrite("W", &Costs::backward_weight)
      .def_readwrite("latency", &Costs::latency)
      .def("of", &Costs::of, py::arg("type"))
      .def("__repr__", &costs_repr);

  py::class_<TimedAction>(m, "TimedAction",
                          "An action with its simulated times. RECV: start = posted, end = data arrived.")
      .def_readonly("action", &TimedAction::action)
      .def_readonly("start", &TimedAction::start)
      .def_readonly("end", &TimedAction::end)
      .def("__repr__", [](const TimedAction& t) {
        return "TimedAction(" + to_string(t.action) + ", start=" + py::str(py::float_(t.start)).cast<std::string>() +
               ", end=" + py::str(py::float_(t.end)).cast<std::string>() + ")";
      });

  py::class_<SimResult>(m, "SimResult")
      .def_readonly("makespan", &SimResult::makespan)
      .def_readonly("busy", &SimResult::busy)
      .def_readonly("idle", &SimResult::idle)
      .def_readonly("bubble", &SimResult::bubble, "total idle / (ranks x makespan)")
      .def_readonly("peak_activations", &SimResult::peak_activations)
      .def_readonly("timeline", &SimResult::timeline, "per rank, every action with its start and end, in list order")
      .def("__repr__", [](const SimResult& r) {
        return "SimResult(makespan=" + py::str(py::float_(r.makespan)).cast<std::string>() +
               ", bubble=" + py::str(py::float_(r.bubble)).cast<std::string>() +
               ", peak_activations=" + py::str(py::cast(r.peak_activations)).cast<std::string>() + ")";
      });

  py::register_exception<DeadlockError>(m, "ScheduleDeadlockError", PyExc_RuntimeError);

  m.def("schedule_names", &schedule_names);
  m.def("placement_names", &placement_names);
  m.def("check_placement",
        [](int pp, int num_stages, const std::string& placement) { placement_of(pp, num_stages, placement); },
        py::arg("pp"), py::arg("num_stages"), py::arg("placement") = "loop",
        "Raise ValueError unless the placement can put num_stages stages on pp ranks.");
  m.def("stage_rank",
        [](int stage, int pp, int num_stages, const std::string& placement) {
          return placement_of(pp, num_stages, placement).rank_of(stage);
        },
        py::arg("stage"), py::arg("pp"), py::arg("num_stages"), py::arg("placement") = "loop",
        "The pipeline rank that runs `stage` (csrc/schedule/placement.h): loop = stage mod pp, v = stage s and "
        "2 pp - 1 - s on one rank.");
  m.def("rank_stages",
        [](int rank, int pp, int num_stages, const std::string& placement) {
          return placement_of(pp, num_stages, placement).stages_of(rank);
        },
        py::arg("rank"), py::arg("pp"), py::arg("num_stages"), py::arg("placement") = "loop",
        "The stages pipeline rank `rank` runs, ascending.");
  m.def("schedule_placement", [](const std::string& name) { return to_string(schedule_placement(name)); },
        py::arg("name"), "Where the named schedule puts its stages: 'loop' or 'v'.");
  m.def("splits_backward", &splits_backward, py::arg("name"),
        "Whether the named schedule splits the backward into I and W (what --merge-wgrad merges).");
  m.def("least_virtual_stages", &least_virtual_stages, py::arg("name"),
        "The fewest model chunks per rank the named schedule runs (a count left to the planner is asked at it).");
  m.def("check_lookahead", &check_lookahead, py::arg("micro_batches"), py::arg("lookahead"),
        "Refuses more lookahead forwards than the step has micro-batches (any schedule).");
  m.def("least_micro_batches", &least_micro_batches, py::arg("name"), py::arg("pp"),
        "The fewest micro-batches the named schedule takes on pp ranks (a count left to the planner is asked at it).");
  m.def("activation_bound", &activation_bound, py::arg("name"), py::arg("pp"), py::arg("micro_batches"),
        py::arg("virtual_stages") = 1, py::arg("lookahead") = 0,
        "The most micro-batch activations of one stage chunk any rank holds at once (generators.h).");
  m.def("check_schedule_request", &check_schedule_request, py::arg("name"), py::arg("pp"), py::arg("micro_batches"),
        py::arg("virtual_stages") = 1, py::arg("lookahead") = 0);
  m.def("make_compute_schedule", &make_compute_schedule, py::arg("name"), py::arg("pp"), py::arg("micro_batches"),
        py::arg("virtual_stages") = 1, py::arg("lookahead") = 0, "Compute-only program (F, B, I, W) of every rank.");
  m.def("make_schedule", &make_schedule, py::arg("name"), py::arg("pp"), py::arg("micro_batches"),
        py::arg("virtual_stages") = 1, py::arg("lookahead") = 0, "Program of every rank, with sends and receives.");
  m.def("add_communication",
        [](const Schedule& schedule, int pp, int num_stages, const std::string& placement) {
          return add_communication(schedule, placement_of(pp, num_stages, placement));
        },
        py::arg("schedule"), py::arg("pp"), py::arg("num_stages"), py::arg("placement") = "loop");
  m.def("validate",
        [](const Schedule& schedule, int pp, int num_stages, int micro_batches, const std::string& placement) {
          validate(schedule, placement_of(pp, num_stages, placement), micro_batches);
        },
        py::arg("schedule"), py::arg("pp"), py::arg("num_stages"), py::arg("micro_batches"),
        py::arg("placement") = "loop");
  m.def("simulate",
        [](const Schedule& schedule, int pp, int num_stages, const Costs& costs, const std::vector<Costs>& stage_costs,
           const std::string& placement) {
          return simulate(schedule, placement_of(pp, num_stages, placement), costs, stage_costs);
        },
        py::arg("schedule"), py::arg("pp"), py::arg("num_stages"), py::arg("costs") = Costs(),
        py::arg("stage_costs") = std::vector<Costs>{}, py::arg("placement") = "loop",
        "stage_costs: per stage, the durations of its actions instead of costs' (latency stays costs').");
}

}  // namespace hybrid
