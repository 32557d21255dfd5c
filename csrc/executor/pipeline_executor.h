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
//
// Two consecutive stages on this rank (the v placement's turn, or every stage with pp = 1) hand off without a
// channel: the later stage's F takes the earlier one's output, the earlier one's backward takes the later one's
// input gradient.
//
// Files: pipeline_executor.cpp runs the step and its compute actions; pipeline_p2p.cpp posts and waits for the
// channel traffic. Every action and every wait is recorded in `activity_` (executor/activity.h), so a step stuck
// on a peer can be named from another thread, or after the timeout threw.
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
#include "comm/comm_trace.h"
#include "executor/activity.h"
#include "executor/dp_grad_sync.h"
#include "executor/stage_program.h"
#include "executor/step_loss.h"
#include "grad/grad_buffer.h"
#include "schedule/action.h"
#include "schedule/placement.h"

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

struct ExecutorConfig {
  int pp_rank = 0;
  int pp_size = 1;
  int num_stages = 1;  // pp * virtual stages
  Placement placement = Placement::Loop;  // which rank runs which stage: the schedule's (placement.h)
  int num_micro = 1;
  // zb1 only: W actions of a stage are gathered into one weight-gradient GEMM per layer at the stage's last
  // W (K = all micro-batches' rows) instead of one small GEMM per micro-batch.
  bool merge_weight_grads = false;
  // Every parameter of the rank is written once per step by a native chain -- in the merged W, or with a single
  // micro-batch and no W actions in its one B: write the gradients instead of adding, so the engine need not zero
  // the gradient buffers before the step. Cleared where neither holds.
  bool overwrite_weight_grads = false;
  bool record_trace = false;
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
  using ChannelKey = std::pair<int, int>;  // (peer pp rank, TensorKind)
  // A step's micro-batch `micro` (an input on the first stage, a target on the last), asked for when the
  // forward that consumes it runs: the data can be drawn then instead of being resident for the whole step.
  using MicroBatchFn = std::function<at::Tensor(int micro)>;

  // programs: one per stage of this rank. grads: the engine's gradient buffer (W actions flush it; the DP sync
  // hears of final gradients through it). dp_sync may be null (no DP); stage_buckets: each stage's buckets.
  // comm_trace (tracing only, may be null): the DP collectives' log, whose clock each step starts with this
  // executor's own, so the collectives line up with the compute spans.
  PipelineExecutor(std::vector<Action> actions, ExecutorConfig config,
                   std::map<int, std::shared_ptr<StageProgram>> programs, LossSpec loss,
                   std::map<ChannelKey, Channel> send_channels, std::map<ChannelKey, Channel> recv_channels,
                   std::vector<TensorSpec> stage_input_specs, std::vector<TensorSpec> stage_output_specs,
                   at::Device device, GradBufferPtr grads, std::shared_ptr<DpGradSync> dp_sync,
                   std::map<int, std::vector<int>> stage_buckets, std::shared_ptr<CommTrace> comm_trace = nullptr);

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
  // What the executor is doing now (or was doing when its step threw); safe to call from any thread.
  ActivitySnapshot activity() const { return activity_.snapshot(); }
  const std::map<int, std::shared_ptr<StageProgram>>& programs() const { return programs_; }

 private:
  // The running step's data sources, loss multiplier and losses: set for the duration of run_streamed (the
  // forwards draw from it, and so does a last-stage backward that runs its deferred forward).
  struct StepData {
    const MicroBatchFn* inputs = nullptr;
    StepLoss* loss = nullptr;  // on the rank holding the last stage
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
    Action action;      // the SEND_* that posted it, and the pipeline rank it goes to (for the activity record)
    int peer_pp_rank = -1;
  };

  void execute(const Action& a);
  void forward(const Action& a);
  void backward(const Action& a, bool defer_weight_grads);
  StageProgram& program(const Action& a) const;
  void weight_grads(const Action& a);
  void post_recv(const Action& a, TensorKind kind);
  void post_send(const Action& a, TensorKind kind, const at::Tensor& tensor);
  at::Tensor take_recv(const Action& a, TensorKind kind);
  void await_input(const Action& a);  // make the compute stream (CPU: the host) wait for a's received input
  void reap_sends(bool wait_all);
  Action recv_action(const Action& a, TensorKind kind) const;  // the RECV_* whose message compute action `a` needs
  int recv_peer(const Action& a, TensorKind kind) const;       // the pipeline rank that message comes from
  std::string where(const Action& a) const;                    // "pipeline rank 1 action 1F3", for errors
  MicroState& state(int stage, int micro);
  // The DP buckets of `stage` when actions_[index] is its last gradient action (they become final during it),
  // else null.
  const std::vector<int>* final_grad_buckets(int stage, size_t index) const;
  const Channel& channel(const std::map<ChannelKey, Channel>& channels, int peer, TensorKind kind,
                         const Action& a) const;
  bool is_first_stage(int stage) const { return stage == 0; }
  bool is_last_stage(int stage) const { return stage == config_.num_stages - 1; }
  // Whether this rank holds the first / last stage (and so consumes inputs / targets).
  bool holds_first_stage() const { return placement_.first_rank() == config_.pp_rank; }
  bool holds_last_stage() const { return placement_.last_rank() == config_.pp_rank; }
  // The input of forward `a` when stage a.stage - 1 runs here too (its output, handed on), and the output gradient
  // of backward `a` when stage a.stage + 1 runs here (its input gradient).
  at::Tensor take_local_input(const Action& a);
  at::Tensor take_local_output_grad(const Action& a);

  std::vector<Action> actions_;
  ExecutorConfig config_;
  StagePlacement placement_;
  std::map<int, std::shared_ptr<StageProgram>> programs_;
  LossSpec loss_;
  std::map<ChannelKey, Channel> send_channels_;
  std::map<ChannelKey, Channel> recv_channels_;
  std::vector<TensorSpec> input_specs_;
  std::vector<TensorSpec> output_specs_;
  at::Device device_;
  GradBufferPtr grads_;
  std::shared_ptr<DpGradSync> dp_sync_;
  std::map<int, std::vector<int>> stage_buckets_;
  std::shared_ptr<CommTrace> comm_trace_;
  // Index in actions_ of each stage's last backward-type action (B, I without W, or W): after it the
  // stage's gradients are final for the step and its DP buckets can be reduced.
  std::map<int, size_t> last_grad_action_;
  std::map<int, int> last_w_micro_;  // stage -> micro of its last W (merged weight gradients run there)
  bool overwrite_in_backward_ = false;  // overwrite_weight_grads, written by the B actions

  std::map<std::pair<int, int>, MicroState> micro_;
  std::map<std::tuple<int, int, int>, PendingRecv> recvs_;  // (stage, micro, kind)
  std::vector<PendingSend> sends_;
  Activity activity_;
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
