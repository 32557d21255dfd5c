// Python face of the fp16 loss scaler, global-norm clipping and the fused SGD step
// (hybrid_engine._C.DynamicLossScaler, clip_grad_norm, nonfinite_flag, sgd_step_and_cast). Gradient lists
// may hold None; groups may be None (size 1).
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "amp/grad_clip.h"
#include "amp/loss_scaler.h"
#include "amp/nonfinite.h"
#include "optim/sgd_cast.h"

namespace py = pybind11;

namespace hybrid {

namespace {
using MaybeTensors = std::vector<std::optional<at::Tensor>>;
using MaybeGroup = std::optional<GroupPtr>;

std::vector<at::Tensor> defined_or_empty(const MaybeTensors& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.value_or(at::Tensor()));
  return out;
}

py::dict state_to_dict(const LossScalerState& s) {
  py::dict d;
  d["scale"] = static_cast<double>(s.scale);
  d["growth_tracker"] = s.growth_tracker;
  d["hysteresis_tracker"] = s.hysteresis_tracker;
  d["consecutive_overflows"] = s.consecutive_overflows;
  d["skipped_steps"] = s.skipped_steps;
  return d;
}

template <typename T>
T required(const py::dict& d, const char* key) {
  if (!d.contains(key)) throw py::key_error(std::string("loss scaler state_dict has no '") + key + "'");
  return d[key].cast<T>();
}

LossScalerState state_from_dict(const py::dict& d) {
  LossScalerState s;
  s.scale = static_cast<float>(required<double>(d, "scale"));
  s.growth_tracker = required<int64_t>(d, "growth_tracker");
  s.hysteresis_tracker = required<int64_t>(d, "hysteresis_tracker");
  s.consecutive_overflows = required<int64_t>(d, "consecutive_overflows");
  s.skipped_steps = required<int64_t>(d, "skipped_steps");
  return s;
}
}  // namespace

void bind_amp(py::module_& m, py::module_& testing) {
  py::class_<DynamicLossScaler>(m, "DynamicLossScaler",
                                "fp16 loss scaler: GradScaler's growth/backoff rule, Megatron's hysteresis and "
                                "floor, inf/NaN agreement over a process group.")
      .def(py::init([](double init_scale, double growth_factor, double backoff_factor, int64_t growth_interval,
                       int64_t hysteresis, double min_scale, bool is_static) {
             return DynamicLossScaler(LossScalerConfig{init_scale, growth_factor, backoff_factor, growth_interval,
                                                       hysteresis, min_scale, is_static});
           }),
           py::kw_only(), py::arg("init_scale") = 65536.0, py::arg("growth_factor") = 2.0,
           py::arg("backoff_factor") = 0.5, py::arg("growth_interval") = 2000, py::arg("hysteresis") = 1,
           py::arg("min_scale") = 1.0, py::arg("static") = false)
      .def_property_readonly("scale", &DynamicLossScaler::scale, "Current scale (an fp32 value), no sync.")
      .def_property_readonly("skipped_steps", &DynamicLossScaler::skipped_steps)
      .def_property_readonly("consecutive_overflows", &DynamicLossScaler::consecutive_overflows)
      .def_property_readonly("growth_tracker", &DynamicLossScaler::growth_tracker)
      .def_property_readonly("hysteresis_tracker", &DynamicLossScaler::hysteresis_tracker)
      .def_property_readonly("growth_interval", [](const DynamicLossScaler& s) { return s.config().growth_interval; })
      .def_property_readonly("hysteresis", [](const DynamicLossScaler& s) { return s.config().hysteresis; })
      .def_property_readonly("min_scale", [](const DynamicLossScaler& s) { return s.config().min_scale; })
      .def_property_readonly("is_static", [](const DynamicLossScaler& s) { return s.config().is_static; })
      .def(
          "unscale_and_check",
          [](DynamicLossScaler& self, const MaybeTensors& grads, const MaybeGroup& group,
             std::optional<at::Device> device) {
            return self.unscale_and_check(defined_or_empty(grads), group_or_null(group), device);
          },
          py::arg("grads"), py::arg("group") = py::none(), py::arg("device") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "Unscales `grads` in place (None entries skipped), MAX-reduces the inf/NaN flag over `group`; "
          "True means every rank of the group skips this step. Call update() after.")
      .def(
          "find_nonfinite",
          [](DynamicLossScaler& self, const MaybeTensors& grads, const MaybeGroup& group,
             std::optional<at::Device> device) {
            return self.find_nonfinite(defined_or_empty(grads), group_or_null(group), device);
          },
          py::arg("grads"), py::arg("group") = py::none(), py::arg("device") = py::none(),
          py::call_guard<py::gil_scoped_release>(),
          "Only reads `grads` (None entries skipped): a float32 [1] tensor, 1.0 when any rank of `group` found "
          "an inf/NaN (MAX over the group), else 0.0. No unscale and no host sync: pass it with inv_scale to "
          "sgd_step_and_cast(skip_if=...), read it once the step syncs anyway, then call update().")
      .def_property_readonly("inv_scale", &DynamicLossScaler::inv_scale,
                             "float32(1 / scale), the reciprocal taken in fp64 as torch.amp.GradScaler does.")
      .def("update", &DynamicLossScaler::update, py::arg("found_inf"),
           "Advance scale and counters after a step; found_inf=True for a skipped step.")
      .def("state_dict", [](const DynamicLossScaler& self) { return state_to_dict(self.state()); },
           "Plain dict of Python numbers (torch.save(weights_only=True) can hold it).")
      .def("load_state_dict", [](DynamicLossScaler& self, const py::dict& d) { self.load_state(state_from_dict(d)); },
           py::arg("state_dict"), "Restore state; in static mode the configured scale is kept.")
      .def("__repr__", [](const DynamicLossScaler& self) {
        const auto& s = self.state();
        std::ostringstream out;
        out << "DynamicLossScaler(scale=" << s.scale << ", growth_tracker=" << s.growth_tracker << "/"
            << self.config().growth_interval << ", skipped_steps=" << s.skipped_steps
            << (self.config().is_static ? ", static" : "") << ")";
        return out.str();
      });

  m.def(
      "clip_grad_norm",
      [](const MaybeTensors& split_grads, const MaybeTensors& replicated_grads, double max_norm,
         const MaybeGroup& mp_group, const MaybeGroup& pp_group, std::optional<at::Device> device) {
        return clip_grad_norm(defined_or_empty(split_grads), defined_or_empty(replicated_grads), max_norm,
                              group_or_null(mp_group), group_or_null(pp_group), device);
      },
      py::arg("split_grads"), py::arg("replicated_grads"), py::arg("max_norm"), py::arg("mp_group") = py::none(),
      py::arg("pp_group") = py::none(), py::arg("device") = py::none(), py::call_guard<py::gil_scoped_release>(),
      "Global L2 norm of the model's gradient (MP-split grads summed over mp_group, MP-replicated grads counted "
      "once, stages summed over pp_group); clips in place to max_norm when finite and above it (max_norm <= 0: "
      "measure only). Returns the pre-clip norm.");

  m.def(
      "sgd_step_and_cast",
      [](const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
         const std::vector<at::Tensor>& halves, double lr, double inv_scale, const std::optional<at::Tensor>& skip_if) {
        // Bad arguments are reported while the GIL is held: on the GPU machine (torch 2.11, Python 3.12) an
        // exception thrown inside the GIL-released region crashed the interpreter instead of raising.
        check_sgd_step_and_cast(masters, grads, halves, skip_if);
        py::gil_scoped_release no_gil;
        sgd_step_and_cast(masters, grads, halves, lr, inv_scale, skip_if);
      },
      py::arg("masters"), py::arg("grads"), py::arg("halves"), py::arg("lr"), py::kw_only(),
      py::arg("inv_scale") = 1.0, py::arg("skip_if") = py::none(),
      "Plain SGD on fp32 masters and the cast to the half model weights in one pass: masters[i] -= lr * "
      "grads[i] * inv_scale; halves[i] = masters[i]. skip_if (float32, one element, on the masters' device): "
      "nonzero skips the step, nothing written, without a host sync on CUDA. The grads are never written. One "
      "fused kernel per tensor on CUDA; ATen ops elsewhere.");

  testing.def(
      "nonfinite_flag",
      [](const MaybeTensors& tensors, const at::Device& device) {
        return nonfinite_flag(defined_or_empty(tensors), device);
      },
      py::arg("tensors"), py::arg("device"), py::call_guard<py::gil_scoped_release>(),
      "float32 [1] tensor on `device`: 1.0 if any element of any tensor (None skipped) is inf or NaN, else 0.0. "
      "Reads only; no host sync on CUDA.");
}

}  // namespace hybrid
