// Python face of the pipeline executor and the DP gradient sync.
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

#include "executor/dp_grad_sync.h"
#include "executor/pipeline_executor.h"

namespace py = pybind11;

namespace hybrid {

namespace {

// Meta tensors describe what travels between stages: shape and dtype, no storage.
std::vector<TensorSpec> to_specs(const std::vector<at::Tensor>& examples) {
  std::vector<TensorSpec> specs;
  for (const auto& t : examples) specs.push_back({t.sizes().vec(), t.scalar_type()});
  return specs;
}

std::map<PipelineExecutor::ChannelKey, Channel> to_channels(
    const std::map<std::pair<int, int>, std::pair<GroupPtr, int>>& entries) {
  std::map<PipelineExecutor::ChannelKey, Channel> channels;
  for (const auto& [key, value] : entries) channels[key] = Channel{value.first, value.second};
  return channels;
}

}  // namespace

void bind_executor(py::module_& m) {
  py::class_<DpGradSync, std::shared_ptr<DpGradSync>>(m, "DpGradSync",
                                                      "Sums flat gradient buckets over the DP group.")
      .def(py::init<std::vector<at::Tensor>, GroupPtr>(), py::arg("buckets"), py::arg("dp_group"))
      .def(
          "launch", [](DpGradSync& sync, int bucket) { sync.launch(bucket); }, py::arg("bucket"),
          py::call_guard<py::gil_scoped_release>())
      .def("finish", &DpGradSync::finish, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("num_buckets", &DpGradSync::num_buckets)
      .def(
          "last_step_launches",
          [](const DpGradSync& sync) {
            // (bucket, cause) in launch order; cause: "notified" (as its last gradient became final, during
            // the backward), "action_end" (after the stage's last gradient action) or "finish".
            static const char* const causes[] = {"notified", "action_end", "finish"};
            std::vector<std::pair<int, std::string>> out;
            for (const BucketLaunch& l : sync.last_step_launches()) {
              out.emplace_back(l.bucket, causes[static_cast<int>(l.cause)]);
            }
            return out;
          },
          "The bucket all-reduces of the last finished step, in launch order, with why each started.");

  py::class_<TraceEvent>(m, "TraceEvent")
      .def_readonly("action", &TraceEvent::action)
      .def_readonly("start_us", &TraceEvent::start_us)
      .def_readonly("end_us", &TraceEvent::end_us);

  py::class_<PipelineExecutor>(m, "PipelineExecutor",
                               "Runs one pipeline rank's action list per step (see csrc/executor).")
      .def(py::init([](std::vector<Action> actions, int pp_rank, int pp_size, int num_stages, int num_micro,
                       py::function stage_fn, py::object loss_fn,
                       std::map<std::pair<int, int>, std::pair<GroupPtr, int>> send_channels,
                       std::map<std::pair<int, int>, std::pair<GroupPtr, int>> recv_channels,
                       std::vector<at::Tensor> input_specs, std::vector<at::Tensor> output_specs,
                       const std::string& device, std::shared_ptr<DpGradSync> dp_sync,
                       std::map<int, std::vector<int>> stage_buckets, bool merge_weight_grads, bool record_trace,
                       bool overwrite_weight_grads) {
             ExecutorConfig config;
             config.pp_rank = pp_rank;
             config.pp_size = pp_size;
             config.num_stages = num_stages;
             config.num_micro = num_micro;
             config.merge_weight_grads = merge_weight_grads;
             config.record_trace = record_trace;
             config.overwrite_weight_grads = overwrite_weight_grads;
             // The executor runs with the GIL released; Python is re-entered only to run a stage or the loss.
             auto stage = [stage_fn](int s, const at::Tensor& x) {
               py::gil_scoped_acquire gil;
               return stage_fn(s, x).cast<at::Tensor>();
             };
             PipelineExecutor::LossFn loss;
             if (py::isinstance<py::str>(loss_fn) && loss_fn.cast<std::string>() == "mse") {
               // The course loss without a trip through Python: on the last stage that trip, once per
               // micro-batch, sat on the pipeline's critical path.
               //
               // Computed in fp32 like mse_loss(out.float(), target.float()), bit for bit, but without its
               // per-row memory (experiments/memory_per_row.py): that form keeps fp32 copies of output and
               // target from the forward to the backward (half weights) and returns a 0-dim loss whose storage
               // is the whole micro-batch's fp32 unreduced loss, which the executor's per-micro-batch loss
               // (loss.detach()) kept alive to the end of the step: m of them, 4 * dim bytes per batch row.
               // Here only out and target (alive anyway) are saved, one fp32 temporary of their size exists
               // at a time, and the loss is a fresh scalar.
               loss = [](const at::Tensor& out, const at::Tensor& target) -> at::Tensor {
                 if (out.sizes() != target.sizes()) {  // broadcasting (with its warning): the plain form
                   return at::mse_loss(out.to(at::kFloat), target.to(at::kFloat));
                 }
                 struct Mse : public torch::autograd::Function<Mse> {
                   static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out,
                                             const at::Tensor& target) {
                     ctx->save_for_backward({out, target});
                     at::Tensor d = out.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).sub_(target);
                     return d.mul_(d).mean();  // mse_loss: mean of (a - b)^2
                   }
                   static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                                  torch::autograd::variable_list grads) {
                     const auto saved = ctx->get_saved_variables();
                     const at::Tensor& out = saved[0];
                     // mse_loss_backward: (2 / numel) * (a - b) * grad, in fp32, then the cast to out's dtype
                     at::Tensor d = out.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).sub_(saved[1]);
                     d.mul_(2.0 / static_cast<double>(out.numel())).mul_(grads[0]);
                     return {d.to(out.scalar_type()), at::Tensor()};
                   }
                 };
                 return Mse::apply(out, target);
               };
             } else {
               loss = [fn = py::function(loss_fn)](const at::Tensor& out, const at::Tensor& target) {
                 py::gil_scoped_acquire gil;
                 return fn(out, target).cast<at::Tensor>();
               };
             }
             return std::make_unique<PipelineExecutor>(
                 std::move(actions), config, stage, loss, to_channels(send_channels), to_channels(recv_channels),
                 to_specs(input_specs), to_specs(output_specs), at::Device(device), std::move(dp_sync),
                 std::move(stage_buckets));
           }),
           py::arg("actions"), py::arg("pp_rank"), py::arg("pp_size"), py::arg("num_stages"), py::arg("num_micro"),
           py::arg("stage_fn"), py::arg("loss_fn"), py::arg("send_channels"), py::arg("recv_channels"),
           py::arg("input_specs"), py::arg("output_specs"), py::arg("device"), py::arg("dp_sync") = nullptr,
           py::arg("stage_buckets") = std::map<int, std::vector<int>>{}, py::arg("merge_weight_grads") = false,
           py::arg("record_trace") = false, py::arg("overwrite_weight_grads") = false)
      .def("run", &PipelineExecutor::run, py::arg("inputs"), py::arg("targets"), py::arg("loss_multiplier"),
           py::call_guard<py::gil_scoped_release>())
      .def("trace", &PipelineExecutor::trace)
      .def_property_readonly("overwrites_weight_grads",
                             [](const PipelineExecutor& e) { return e.config().overwrite_weight_grads; })
      .def_property_readonly("actions", &PipelineExecutor::actions)
      .def_property_readonly("dp_sync", &PipelineExecutor::dp_sync, "The DP gradient sync (None without one).");
}

}  // namespace hybrid
