// Runs one rank's pipeline action list (see csrc/schedule/action.h) for one training step.
//
// Communication: every (sender, receiver, kind) has its own two-rank process group ("channel"), so a
// channel carries one direction of one kind of tensor and its sends and receives pair up in order; the
// schedule simulator has already checked that this order can never deadlock. RECV_* posts an irecv where
// the schedule puts it (ahead of need); the compute action that consumes it waits on that work only then.
// SEND_* is an isend whose work is waited only when the step ends or the send has completed.
//
// Lifetime: a micro-batch's stage input and output are dropped by the backward that last needs them; the
// gradient sent upstream is dropped once its send completes.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "executor/dp_grad_sync.h"
#include "schedule/action.h"

namespace hybrid {

enum class TensorKind { Activation = 0, Gradient = 1 };

struct Channel {
  GroupPtr group;
  int peer_group_rank = 0;  // the peer's rank within `group`
};

struct TensorSpec {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

// A stage the executor runs itself, without autograd: a chain of Linear (+ ReLU) layers (tp/linear_chain.h).
// Its forward builds no graph and its backward runs on the executor's thread; on CUDA that saves the autograd
// engine's hand-off to its device thread (and back) on every backward action, which sat on the pipeline's
// critical path at small micro-batches.
struct NativeStage {
  std::vector<at::Tensor> params;  // weight_0, bias_0 (undefined: none), weight_1, ...
  std::vector<bool> relu;          // ReLU after layer i
  bool recompute = false;          // keep only the stage input until the backward
};

struct ExecutorConfig {
  int pp_rank = 0;
  int pp_size = 1;
  int num_stages = 1;  // pp * virtual stages
  int num_micro = 1;
  // zb1 only: W actions of a stage are gathered into one weight-gradient GEMM per layer at the stage's last
  // W (K = all micro-batches' rows) instead of one small GEMM per micro-batch.
  bool merge_weight_grads = false;
  // With merged weight gradients covering every parameter of the rank: write them instead of adding, so
  // the engine need not zero the gradient buffers before the step.
  bool overwrite_weight_grads = false;
  bool record_trace = false;
  // The loss is the C++ mean squared error (executor/mse_loss.h): a native last stage then computes the loss
  // and its gradient together, without autograd.
  bool native_mse = false;
};

// One executed compute action, in microseconds from the step's start: device time (CUDA events on the
// compute stream) on a GPU, host clock on the CPU.
struct TraceEvent {
  Action action;
  double start_us = 0;
  double end_us = 0;
};

class PipelineExecutor {
 public:
  // Runs the forward of global stage `stage` on `input`; returns the stage output.
  using StageFn = std::function<at::Tensor(int stage, const at::Tensor& input)>;
  // Loss of one micro-batch on the last stage (a scalar); the executor multiplies by the loss multiplier.
  using LossFn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  using ChannelKey = std::pair<int, int>;  // (peer pp rank, TensorKind)
  // A step's micro-batch `micro` (an input on the first stage, a target on the last), asked for when the
  // forward that consumes it runs: the data can be drawn then instead of being resident for the whole step.
  using MicroBatchFn = std::function<at::Tensor(int micro)>;

  PipelineExecutor(std::vector<Action> actions, ExecutorConfig config, StageFn stage_fn, LossFn loss_fn,
                   std::map<ChannelKey, Channel> send_channels, std::map<ChannelKey, Channel> recv_channels,
                   std::vector<TensorSpec> stage_input_specs, std::vector<TensorSpec> stage_output_specs,
                   at::Device device, std::shared_ptr<DpGradSync> dp_sync,
                   std::map<int, std::vector<int>> stage_buckets, std::map<int, NativeStage> native_stages = {});

  // One step. `inputs` has num_micro tensors on a rank holding stage 0 (else empty); `targets` likewise on
  // the rank holding the last stage. Returns the per-micro-batch losses (unmultiplied, detached) on the
  // rank holding the last stage, else an empty list. Gradients are accumulated into the parameters'
  // .grad and summed over DP before this returns (the caller folds 1/dp into loss_multiplier for the mean).
  std::vector<at::Tensor> run(const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& targets,
                              double loss_multiplier);
  // The same step with micro-batches drawn on demand (either function may be empty on a rank that holds
  // neither the first nor the last stage). Each is called once per micro-batch, in forward order, and what it
  // returns is dropped as soon as the micro-batch no longer needs it.
  std::vector<at::Tensor> run_streamed(const MicroBatchFn& inputs, const MicroBatchFn& targets,
                                       double loss_multiplier);

  const std::vector<Action>& actions() const { return actions_; }
  const std::vector<TraceEvent>& trace() const { return trace_; }
  const ExecutorConfig& config() const { return config_; }
  const std::shared_ptr<DpGradSync>& dp_sync() const { return dp_sync_; }
  std::vector<int> native_stage_ids() const {
    std::vector<int> ids;
    for (const auto& entry : native_stages_) ids.push_back(entry.first);
    return ids;
  }

 private:
  struct MicroState {
    at::Tensor input;       // stage input (requires grad on all but the first stage, unless native)
    at::Tensor output;      // stage output, root of this micro-batch's backward
    at::Tensor loss;        // last stage: multiplied loss, root of the backward
    at::Tensor input_grad;  // gradient to send upstream
    // Native stages: what chain_backward needs, and on the last stage the gradient of the output (computed
    // with the loss in the forward).
    std::vector<at::Tensor> saved;
    at::Tensor output_grad;
    // Last stage with recompute: the forward (and the loss) runs in the backward; `saved` holds the input.
    bool forward_deferred = false;
  };
  // The running step's data sources, loss multiplier and losses: set for the duration of run_streamed (the
  // forwards draw from it, and so does a last-stage backward that runs its deferred forward).
  struct StepData {
    const MicroBatchFn* inputs = nullptr;
    const MicroBatchFn* targets = nullptr;
    double loss_multiplier = 1.0;
    std::vector<at::Tensor>* losses = nullptr;
  };
  StepData step_;
  struct PendingRecv {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor buffer;
    bool waited = false;  // gloo's recv work must be waited exactly once (a second wait takes the next message)
  };
  struct PendingSend {
    c10::intrusive_ptr<c10d::Work> work;
    at::Tensor tensor;  // kept alive until the send completes
  };

  void execute(const Action& a);
  void forward(const Action& a);
  void backward(const Action& a, bool defer_weight_grads);
  void native_forward(const Action& a, const NativeStage& stage);
  void native_backward(const Action& a, const NativeStage& stage, bool defer_weight_grads);
  // The last stage's loss on `output` against its micro-batch's target (drawn now): records the unmultiplied
  // loss in the step's losses and returns the gradient of loss * loss_multiplier with respect to the output.
  at::Tensor loss_grad(const Action& a, const at::Tensor& output);
  const NativeStage* native_stage(int stage) const;
  void weight_grads(const Action& a);
  void post_recv(const Action& a, TensorKind kind);
  void post_send(const Action& a, TensorKind kind, const at::Tensor& tensor);
  at::Tensor take_recv(const Action& a, TensorKind kind);
  void await_input(const Action& a);  // make the compute stream (CPU: the host) wait for a's received input
  void reap_sends(bool wait_all);
  MicroState& state(int stage, int micro);
  // The DP buckets of `stage` when actions_[index] is its last gradient action (they become final during it),
  // else null.
  const std::vector<int>* final_grad_buckets(int stage, size_t index) const;
  const Channel& channel(const std::map<ChannelKey, Channel>& channels, int peer, TensorKind kind,
                         const Action& a) const;
  bool is_first_stage(int stage) const { return stage == 0; }
  bool is_last_stage(int stage) const { return stage == config_.num_stages - 1; }
  // Whether this rank holds the first / last stage (and so consumes inputs / targets).
  bool holds_first_stage() const { return stage_owner(0, config_.pp_size) == config_.pp_rank; }
  bool holds_last_stage() const { return stage_owner(config_.num_stages - 1, config_.pp_size) == config_.pp_rank; }

  std::vector<Action> actions_;
  ExecutorConfig config_;
  StageFn stage_fn_;
  LossFn loss_fn_;
  std::map<ChannelKey, Channel> send_channels_;
  std::map<ChannelKey, Channel> recv_channels_;
  std::vector<TensorSpec> input_specs_;
  std::vector<TensorSpec> output_specs_;
  at::Device device_;
  std::shared_ptr<DpGradSync> dp_sync_;
  std::map<int, std::vector<int>> stage_buckets_;
  std::map<int, NativeStage> native_stages_;
  // Index in actions_ of each stage's last backward-type action (B, I without W, or W): after it the
  // stage's gradients are final for the step and its DP buckets can be reduced.
  std::map<int, size_t> last_grad_action_;
  std::map<int, int> last_w_micro_;  // stage -> micro of its last W (merged weight gradients run there)

  std::map<std::pair<int, int>, MicroState> micro_;
  std::map<std::tuple<int, int, int>, PendingRecv> recvs_;  // (stage, micro, kind)
  std::vector<PendingSend> sends_;
  std::vector<TraceEvent> trace_;
  std::chrono::steady_clock::time_point step_start_;
  // GPU tracing: events recorded around each compute action, resolved to times once the step is over.
  struct DeviceSpan {
    Action action;
    std::shared_ptr<c10::Event> start, end;
  };
  std::vector<DeviceSpan> device_spans_;
  std::shared_ptr<c10::Event> step_event_;
  std::shared_ptr<c10::Event> record_event();
  void resolve_device_trace();
};

}  // namespace hybrid
