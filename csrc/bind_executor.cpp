// Python face of the pipeline executor and the DP gradient sync.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <stdexcept>
#include <optional>
#include <tuple>

#include "comm/comm_trace.h"
#include "comm/comm_trace_ref.h"
#include "executor/dp_grad_sync.h"
#include "executor/dp_param_gather.h"
#include "executor/pipeline_executor.h"
#include "executor/graphed_autograd_stage.h"
#include "executor/graphed_stage.h"
#include "executor/stage_program.h"

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
  py::class_<CommSpan>(m, "CommSpan",
                       "One DP, MP or CP collective of a traced step, in microseconds from the step's start.")
      .def_property_readonly("kind", [](const CommSpan& s) { return std::string(comm_kind_name(s.kind)); },
                             "all_reduce | reduce_scatter (gradient buckets) | all_gather (ZeRO-1 parameters, CP's "
                             "K/V) | send_recv (a hop of CP's ring)")
      .def_readonly("bucket", &CommSpan::bucket, "DP: the bucket; MP: the chain layer; CP: the hop")
      .def_property_readonly("axis", [](const CommSpan& s) { return std::string(comm_axis_name(s.axis)); },
                             "dp | mp | cp: the group the collective ran on")
      .def_readonly("start_us", &CommSpan::start_us)
      .def_readonly("end_us", &CommSpan::end_us);
  py::class_<CommTrace, std::shared_ptr<CommTrace>>(m, "CommTrace",
                                                    "The DP collectives of traced steps, launch to completion.")
      .def(py::init([](const std::string& device) { return std::make_shared<CommTrace>(at::Device(device)); }),
           py::arg("device"))
      .def("take", &CommTrace::take, py::call_guard<py::gil_scoped_release>(),
           "The completed collectives recorded since the last call, relative to the last step's start.")
      .def(
          "launched",
          [](CommTrace& trace, const std::string& kind, int bucket, c10d::Work& work) {
            if (kind != "send_recv" && kind != "all_gather" && kind != "reduce_scatter" && kind != "all_reduce")
              throw std::invalid_argument("CommTrace.launched: kind " + kind);
            const CommKind k = kind == "send_recv"        ? CommKind::SendRecv
                               : kind == "all_gather"     ? CommKind::AllGather
                               : kind == "reduce_scatter" ? CommKind::ReduceScatter
                                                          : CommKind::AllReduce;
            trace.launched(k, bucket, c10::intrusive_ptr<c10d::Work>::reclaim_copy(&work), CommAxis::CP);
          },
          py::arg("kind"), py::arg("bucket"), py::arg("work"),
          "Record a context-parallel transfer just issued from Python (its torch.distributed Work): kind "
          "send_recv | all_gather | reduce_scatter | all_reduce, bucket the hop.")
      .def(
          "completed_on_host",
          [](CommTrace& trace, const std::string& kind, int bucket, int64_t launch_ns, int64_t done_ns) {
            trace.completed_on_host(kind == "send_recv" ? CommKind::SendRecv : CommKind::AllGather, bucket, launch_ns,
                                    done_ns, CommAxis::CP);
          },
          py::arg("kind"), py::arg("bucket"), py::arg("launch_ns"), py::arg("done_ns"),
          "Record a host (gloo) context-parallel transfer timed by its caller on time.monotonic_ns's clock: kind "
          "send_recv | all_gather.")
      .def_property_readonly(
          "script_object",
          [](const std::shared_ptr<CommTrace>& trace) {
            return torch::jit::toPyObject(c10::IValue(c10::make_intrusive<CommTraceRef>(trace)));
          },
          "This trace as torch.classes.hybrid.CommTrace, the form torch.ops.hybrid's layer operators take.");

  py::class_<DpParamGather, std::shared_ptr<DpParamGather>>(
      m, "DpParamGather", "ZeRO-1: per-bucket asynchronous all-gathers of the updated parameters over DP.")
      .def(py::init<std::vector<at::Tensor>, GroupPtr, std::shared_ptr<CommTrace>>(), py::arg("params"),
           py::arg("dp_group"), py::arg("trace") = nullptr,
           "params: every bucket's flat parameter buffer (laid out like its gradient bucket).")
      .def("launch", &DpParamGather::launch, py::arg("bucket"), py::call_guard<py::gil_scoped_release>())
      .def(
          "wait", [](DpParamGather& g, int bucket) { g.wait(bucket); }, py::arg("bucket"),
          py::call_guard<py::gil_scoped_release>(), "Before a layer that reads the bucket's parameters.")
      .def("wait_all", &DpParamGather::wait_all, py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("in_flight", &DpParamGather::in_flight)
      .def_property_readonly("num_buckets", &DpParamGather::num_buckets)
      .def(
          "last_waits",
          [](const DpParamGather& g) {
            std::vector<std::pair<int, std::string>> out;
            for (const auto& [bucket, why] : g.last_waits()) {
              out.emplace_back(bucket, why == GatherWait::BeforeUse ? "before_use" : "all");
            }
            return out;
          },
          "(bucket, why) of the waits that completed the latest round of gathers, in order: 'before_use' (the "
          "forward, just before a layer reading it) or 'all' (wait_all).");

  py::class_<DpGradSync, std::shared_ptr<DpGradSync>>(m, "DpGradSync",
                                                      "Sums flat gradient buckets over the DP group.")
      .def(py::init([](std::vector<at::Tensor> buckets, GroupPtr dp_group, std::optional<at::ScalarType> wire_dtype,
                       bool shard, std::shared_ptr<CommTrace> trace, std::vector<at::Tensor> keep_shards,
                       std::optional<GroupPtr> replica_group, bool every_micro) {
             return std::make_shared<DpGradSync>(std::move(buckets), std::move(dp_group), wire_dtype, shard,
                                                 std::move(trace), std::move(keep_shards),
                                                 replica_group ? *replica_group : GroupPtr(), every_micro);
           }),
           py::arg("buckets"), py::arg("dp_group"), py::arg("wire_dtype") = std::nullopt, py::arg("shard") = false,
           py::arg("trace") = nullptr, py::arg("keep_shards") = std::vector<at::Tensor>{},
           py::arg("replica_group") = std::nullopt, py::arg("every_micro") = false,
           "wire_dtype: the dtype the buckets travel in (e.g. torch.bfloat16: half the bytes for fp32 gradients); "
           "None: their own. shard: reduce-scatter (each DP rank's equal piece of a bucket gets the sum) instead "
           "of all-reduce. trace: a CommTrace that records each launch (--trace). keep_shards (ZeRO-2): one "
           "tensor per bucket that receives this rank's summed piece, the bucket's bytes then released. "
           "replica_group (hybrid sharding): each summed piece is all-reduced over it too. every_micro (with "
           "keep_shards): a stage's buckets are reduced after each of its gradient actions and summed into the shards.")
      .def_property_readonly("shard", &DpGradSync::shard)
      .def_property_readonly("keeps_shards", &DpGradSync::keeps_shards)
      .def_property_readonly("every_micro", &DpGradSync::every_micro)
      .def("restore", &DpGradSync::restore, py::call_guard<py::gil_scoped_release>(),
           "Reallocate the buckets released after their reduce-scatter (keep_shards) and zero every bucket.")
      .def_property_readonly("wire_dtype", &DpGradSync::wire_dtype)
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

  py::class_<StageProgram, std::shared_ptr<StageProgram>>(m, "StageProgram",
                                                          "What the executor runs for one stage's F, B and I.")
      .def_property_readonly("native", &StageProgram::native)
      .def("describe", &StageProgram::describe)
      .def("release", &StageProgram::release,
           "Free what the program recorded to replay (a graphed stage's CUDA graphs, their pools and buffers); the "
           "next micro-batch runs eagerly and records afresh. Before destroying the groups whose collectives a "
           "graph captured (NCCL waits for such graphs to die), with no replay queued.")
      .def("__repr__", &StageProgram::describe);
  py::class_<NativeChainStage, StageProgram, std::shared_ptr<NativeChainStage>>(
      m, "NativeChainStage",
      "A Linear(+ReLU) chain run by C++ without autograd, on one rank or tensor-parallel (tp/linear_chain.h).")
      .def(py::init([](const std::vector<std::optional<at::Tensor>>& params, const std::vector<bool>& relu,
                       bool recompute, GradBufferPtr grads, std::shared_ptr<DpParamGather> param_gather,
                       std::optional<std::vector<int>> kinds, const std::optional<GroupPtr>& mp_group, int chunks,
                       std::shared_ptr<CommTrace> trace) {
             if (params.size() != 2 * relu.size() || (kinds && kinds->size() != relu.size())) {
               throw std::invalid_argument("native chain: " + std::to_string(relu.size()) + " layers need " +
                                           std::to_string(2 * relu.size()) + " params and as many kinds, got " +
                                           std::to_string(params.size()) + " params");
             }
             std::vector<ChainLayer> layers;
             for (size_t i = 0; i < relu.size(); ++i) {
               const int kind = kinds ? (*kinds)[i] : 0;
               if (kind < 0 || kind > static_cast<int>(LayerKind::ColumnGather)) {
                 throw std::invalid_argument("native chain: unknown layer kind " + std::to_string(kind));
               }
               layers.push_back({params[2 * i].value_or(at::Tensor()), params[2 * i + 1].value_or(at::Tensor()),
                                 static_cast<LayerKind>(kind), relu[i]});
             }
             LinearChain chain(std::move(layers), group_or_null(mp_group), ChainChunking{chunks}, std::move(trace));
             return std::make_shared<NativeChainStage>(std::move(chain), recompute, std::move(grads),
                                                       std::move(param_gather));
           }),
           py::arg("params"), py::arg("relu"), py::arg("recompute"), py::arg("grads"),
           py::arg("param_gather") = nullptr, py::arg("kinds") = py::none(), py::arg("mp_group") = py::none(),
           py::arg("chunks") = 0, py::arg("trace") = nullptr,
           "params: [w0, b0 or None, w1, ...]; relu[i]: ReLU after layer i. param_gather: each layer waits for "
           "its parameters' ZeRO-1 all-gather just before it runs. kinds[i]: 0 dense, 1 column-parallel, 2 "
           "row-parallel, 3 column-parallel with its output all-gathered (default: all dense); mp_group: their MP "
           "group; chunks: row chunks per micro-batch whose MP collectives overlap the next chunk's GEMMs (0: "
           "auto); trace: where the MP collectives are recorded (--trace).")
      .def_property_readonly("mp_size", [](const NativeChainStage& s) { return s.chain().mp_size(); });
  py::class_<GraphedChainStage, StageProgram, std::shared_ptr<GraphedChainStage>>(
      m, "GraphedChainStage",
      "A native chain whose F and B of every micro-batch are CUDA graphs (executor/graphed_stage.h).")
      .def(py::init([](std::shared_ptr<NativeChainStage> eager, const std::string& device, bool host_rerun) {
             return std::make_shared<GraphedChainStage>(std::move(eager), at::Device(device), host_rerun);
           }),
           py::arg("eager"), py::arg("device"), py::arg("host_rerun") = false,
           "eager: the native chain to graph (it runs each micro-batch index's first F and B, the warm-up); "
           "host_rerun: replay by running the recorded host code again (tests without a GPU).")
      .def_property_readonly("captures", &GraphedChainStage::captures)
      .def_property_readonly("replays", &GraphedChainStage::replays)
      .def_property_readonly("slots", &GraphedChainStage::slots,
                             "Micro-batch indices it holds graphs (or their recorded shapes) for.");
  py::class_<GraphedAutogradStage, StageProgram, std::shared_ptr<GraphedAutogradStage>>(
      m, "GraphedAutogradStage",
      "An autograd stage whose F and B are CUDA graphs, in slots reused by micro-batches not in flight together "
      "(executor/graphed_autograd_stage.h).")
      .def(py::init([](std::shared_ptr<AutogradStage> eager, GradBufferPtr grads, std::vector<at::Tensor> params,
                       std::shared_ptr<DpParamGather> param_gather, const std::string& device, bool host_rerun) {
             return std::make_shared<GraphedAutogradStage>(std::move(eager), std::move(grads), std::move(params),
                                                           std::move(param_gather), at::Device(device), host_rerun);
           }),
           py::arg("eager"), py::arg("grads"), py::arg("params"), py::arg("param_gather") = nullptr,
           py::arg("device") = "cuda", py::arg("host_rerun") = false,
           "eager: the autograd stage to graph (it runs each slot's first micro-batch, the warm-up); params, "
           "param_gather: ZeRO-1's overlapped gathers, waited for before a capture and each F replay; host_rerun: "
           "replay by running the recorded host code again (tests without a GPU).")
      .def_property_readonly("captures", &GraphedAutogradStage::captures)
      .def_property_readonly("replays", &GraphedAutogradStage::replays)
      .def_property_readonly("stashed", &GraphedAutogradStage::stashed,
                             "Weight-gradient stashes its I replays left for the W actions (zero-bubble).")
      .def_property_readonly("slots", &GraphedAutogradStage::slots)
      .def_property_readonly("slot_of_micro", &GraphedAutogradStage::slot_of_micro,
                             "The slot each micro-batch of the latest step took, by micro-batch index.");
  py::class_<AutogradStage, StageProgram, std::shared_ptr<AutogradStage>>(
      m, "AutogradStage", "Any module, called through Python; its backward is torch's autograd.")
      .def(py::init([](py::function forward, std::string description) {
             // The executor runs with the GIL released; Python is re-entered only to run the stage.
             auto fn = [forward](const at::Tensor& x) {
               py::gil_scoped_acquire gil;
               return forward(x).cast<at::Tensor>();
             };
             return std::make_shared<AutogradStage>(fn, std::move(description));
           }),
           py::arg("forward"), py::arg("description"));

  py::class_<PipelineExecutor>(m, "PipelineExecutor",
                               "Runs one pipeline rank's action list per step (see csrc/executor).")
      .def(py::init([](std::vector<Action> actions, int pp_rank, int pp_size, int num_stages, int num_micro,
                       std::map<int, std::shared_ptr<StageProgram>> programs, py::object loss_fn, bool builtin_mse,
                       std::map<std::pair<int, int>, std::pair<GroupPtr, int>> send_channels,
                       std::map<std::pair<int, int>, std::pair<GroupPtr, int>> recv_channels,
                       std::vector<at::Tensor> input_specs, std::vector<at::Tensor> output_specs,
                       const std::string& device, GradBufferPtr grads, std::shared_ptr<DpGradSync> dp_sync,
                       std::map<int, std::vector<int>> stage_buckets, bool merge_weight_grads, bool record_trace,
                       bool overwrite_weight_grads, std::shared_ptr<CommTrace> comm_trace,
                       const std::string& placement) {
             ExecutorConfig config;
             config.pp_rank = pp_rank;
             config.pp_size = pp_size;
             config.num_stages = num_stages;
             config.num_micro = num_micro;
             config.placement = parse_placement(placement);
             config.merge_weight_grads = merge_weight_grads;
             config.record_trace = record_trace;
             config.overwrite_weight_grads = overwrite_weight_grads;
             LossSpec loss;
             loss.builtin_mse = builtin_mse;
             if (!builtin_mse) {
               loss.fn = [fn = py::function(loss_fn)](const at::Tensor& out, const at::Tensor& target) {
                 py::gil_scoped_acquire gil;
                 return fn(out, target).cast<at::Tensor>();
               };
             }
             return std::make_unique<PipelineExecutor>(
                 std::move(actions), config, std::move(programs), std::move(loss), to_channels(send_channels),
                 to_channels(recv_channels), to_specs(input_specs), to_specs(output_specs), at::Device(device),
                 std::move(grads), std::move(dp_sync), std::move(stage_buckets), std::move(comm_trace));
           }),
           py::arg("actions"), py::arg("pp_rank"), py::arg("pp_size"), py::arg("num_stages"), py::arg("num_micro"),
           py::arg("programs"), py::arg("loss_fn"), py::arg("builtin_mse"), py::arg("send_channels"),
           py::arg("recv_channels"), py::arg("input_specs"), py::arg("output_specs"), py::arg("device"),
           py::arg("grads"), py::arg("dp_sync") = nullptr,
           py::arg("stage_buckets") = std::map<int, std::vector<int>>{}, py::arg("merge_weight_grads") = false,
           py::arg("record_trace") = false, py::arg("overwrite_weight_grads") = false,
           py::arg("comm_trace") = nullptr, py::arg("placement") = "loop",
           "placement: the schedule's stage placement ('loop' | 'v', csrc/schedule/placement.h). programs: {stage: StageProgram} for this rank's stages; loss_fn: a callable (output, target) -> scalar, "
           "or None with builtin_mse (the C++ mean squared error).")
      .def("run", &PipelineExecutor::run, py::arg("inputs"), py::arg("targets"), py::arg("loss_multiplier"),
           py::call_guard<py::gil_scoped_release>())
      .def(
          "run_streamed",
          [](PipelineExecutor& executor, const py::object& inputs, const py::object& targets, double multiplier) {
            auto source = [](const py::object& fn, const char* what) -> PipelineExecutor::MicroBatchFn {
              if (fn.is_none()) return {};
              if (!PyCallable_Check(fn.ptr())) {
                throw py::type_error(std::string(what) + " must be a callable micro-batch -> tensor, or None");
              }
              return [fn, what](int micro) {
                py::gil_scoped_acquire gil;
                py::object t = fn(micro);
                if (!THPVariable_Check(t.ptr())) {
                  throw std::runtime_error(std::string(what) + "(" + std::to_string(micro) +
                                           ") must return a tensor, got " + std::string(py::str(t.get_type())));
                }
                return t.cast<at::Tensor>();
              };
            };
            PipelineExecutor::MicroBatchFn input_fn = source(inputs, "inputs");
            PipelineExecutor::MicroBatchFn target_fn = source(targets, "targets");
            py::gil_scoped_release release;
            return executor.run_streamed(input_fn, target_fn, multiplier);
          },
          py::arg("inputs"), py::arg("targets"), py::arg("loss_multiplier"),
          "run() with micro-batches drawn on demand: inputs / targets are callables micro -> tensor (None on a "
          "rank that needs none), each called once per micro-batch when its forward runs.")
      .def(
          "activity",
          [](const PipelineExecutor& e) {
            static const char* const waits[] = {"none", "recv", "send", "dp_sync"};
            const ActivitySnapshot s = e.activity();
            auto action = [](const std::optional<Action>& a) {
              return a ? py::object(py::str(to_string(*a))) : py::object(py::none());
            };
            py::dict d;
            d["in_step"] = s.in_step;
            d["action"] = action(s.action);
            d["stage"] = s.action ? py::object(py::int_(s.action->stage))
                                  : s.awaited ? py::object(py::int_(s.awaited->stage)) : py::object(py::none());
            d["wait"] = waits[static_cast<int>(s.wait)];
            d["awaited"] = action(s.awaited);
            d["peer_pp_rank"] = s.peer_pp_rank;
            d["steps_started"] = s.steps_started;
            return d;
          },
          "What the executor is doing now, or was doing when its step threw (safe from any thread): in_step, action "
          "(e.g. '1B3'), stage, wait ('none' | 'recv' | 'send' | 'dp_sync'), awaited (the RECV_*/SEND_* waited "
          "on), peer_pp_rank (-1: none), steps_started.")
      .def("trace", &PipelineExecutor::trace)
      .def_property_readonly("overwrites_weight_grads",
                             [](const PipelineExecutor& e) { return e.config().overwrite_weight_grads; })
      .def_property_readonly("actions", &PipelineExecutor::actions)
      .def_property_readonly("programs", &PipelineExecutor::programs, "{stage: StageProgram} of this rank.")
      .def_property_readonly("dp_sync", &PipelineExecutor::dp_sync, "The DP gradient sync (None without one).");
}

}  // namespace hybrid
