// Python face of the engine's gradient buffer (grad/grad_buffer.h): one object per engine, handed to its layers,
// stage programs and executor.
#include <torch/csrc/utils/pybind.h>

#include <tuple>
#include <vector>

#include "grad/accumulate.h"
#include "grad/grad_buffer.h"
#include "grad/grad_hooks.h"
#include "grad/released_storage.h"

namespace py = pybind11;

namespace hybrid {

void bind_grad(py::module_& m) {
  m.def("release_storage", &release_storage, py::arg("flat"),
        "Free a flat buffer's bytes, its views kept valid but unusable until restore_storage (grad/released_storage.h).");
  m.def("restore_storage", &restore_storage, py::arg("flat"),
        "Reallocate a released flat buffer's bytes (uninitialised); a no-op for one that holds them.");
  m.def("storage_released", &storage_released, py::arg("flat"));
  m.def(
      "add_into", [](at::Tensor target, const at::Tensor& grad) { add_into(target, grad); }, py::arg("target"),
      py::arg("grad"),
      "target += grad in target's dtype, as the gradient hooks fold a half gradient into its fp32 main grad "
      "(grad/accumulate.h).");
  py::class_<GradBuffer, GradBufferPtr>(m, "GradBuffer",
                                        "One engine's gradients: flat DP buckets, fp32 main-grad routes of half "
                                        "weights, deferred weight gradients (zero-bubble W), final-gradient "
                                        "announcements. No process-wide state: every engine owns its own.")
      .def(py::init<std::vector<at::Tensor>>(), py::arg("buckets") = std::vector<at::Tensor>{})
      .def_property_readonly("buckets", &GradBuffer::buckets)
      .def("bucket_shard", &GradBuffer::bucket_shard, py::arg("bucket"), py::arg("rank"), py::arg("size"),
           "[begin, end) elements of `bucket` owned by DP rank `rank` of `size` (equal contiguous pieces).")
      .def("set_main_grad", &GradBuffer::set_main_grad, py::arg("param"), py::arg("buffer"),
           "Accumulate `param`'s gradient into `buffer` (e.g. fp32 for a half weight) instead of param.grad.")
      .def("has_main_grad", &GradBuffer::has_main_grad, py::arg("param"))
      .def("set_restore_on_write", &GradBuffer::set_restore_on_write, py::arg("restore"),
           "While set, a released bucket is restored (zeroed) by the first gradient write into it (ZeRO-2/3 "
           "reducing per micro-batch).")
      .def(
          "install_grad_hooks",
          [](GradBuffer& g, const std::vector<at::Tensor>& params) {
            install_grad_hooks(GradBufferPtr::unsafe_reclaim_from_nonowning(&g), params);
          },
          py::arg("params"),
          "Every parameter's gradient, once autograd has accumulated it into param.grad, goes to its fp32 main "
          "grad (if routed) and is announced final, by a C++ hook (grad/grad_hooks.h).")
      .def_property_readonly(
          "address", [](GradBuffer& g) { return reinterpret_cast<int64_t>(&g); },
          "This buffer's address, the form torch.ops.hybrid's layer operators take (tp/ops.cpp says why); valid "
          "while this object lives.")
      .def("grad_final", &GradBuffer::grad_final, py::arg("param"),
           "announce that param's gradient got its last write of this backward (a no-op unless the executor "
           "listens: during a stage's last gradient action)")
      .def(
          "set_defer", [](GradBuffer& g, bool defer) { g.wgrad().set_defer(defer); }, py::arg("defer"),
          "While set, the weight gradients of this buffer's layers are stashed for a later flush (zero-bubble W).")
      .def_property_readonly("deferring", [](GradBuffer& g) { return g.wgrad().defer(); })
      .def(
          "begin", [](GradBuffer& g, int stage, int micro) { g.wgrad().begin({stage, micro}); }, py::arg("stage"),
          py::arg("micro"), "Label the weight gradients the next backward stashes.")
      .def("end", [](GradBuffer& g) { g.wgrad().end(); })
      .def(
          "flush", [](GradBuffer& g, int stage, int micro) { return g.flush({stage, micro}); }, py::arg("stage"),
          py::arg("micro"), py::call_guard<py::gil_scoped_release>(),
          "Accumulate the stashed weight gradients of (stage, micro); returns the parameters updated.")
      .def(
          "flush_merged",
          [](GradBuffer& g, const std::vector<std::tuple<int, int>>& pairs) {
            std::vector<WgradKey> keys;
            for (const auto& [stage, micro] : pairs) keys.push_back({stage, micro});
            return g.flush_merged(keys);
          },
          py::arg("keys"), py::call_guard<py::gil_scoped_release>(),
          "Flush several (stage, micro) keys with one GEMM per parameter (rows concatenated).")
      .def("flush_all", &GradBuffer::flush_all, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("pending", [](GradBuffer& g) { return g.wgrad().pending(); },
                             "Stashed weight-gradient entries, all keys.")
      .def(
          "clear", [](GradBuffer& g) { g.wgrad().clear(); }, "Drop every stash uncomputed and leave defer mode.");
}

}  // namespace hybrid
