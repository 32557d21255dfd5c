// A native chain stage (NativeChainStage) whose F and B of every micro-batch are CUDA graphs: the chain's
// kernels -- and with mp > 1 its tensor-parallel all-reduces, on the capture stream -- launched with one call
// instead of one host round each. On the course MLP at 4 GPUs the eager step took 2-3x its GEMMs' time, the
// rest being launches and host work.
//
// What stays outside the graphs: the P2P sends and receives and the DP collectives (the executor's), ZeRO-1's
// parameter gathers (waited for before the replay), and the announcements that a gradient is final (made after
// B's replay, so the DP sync hears of every parameter as it does from the eager chain, only later).
//
// Static addresses. Every micro-batch index has its own graphs and buffers: the received input (or the first
// stage's micro-batch), the target and the received output gradient are copied into them before a replay; the
// output, the input gradient, the loss's output gradient and the saved activations live where the capture put
// them. This is what makes several micro-batches in flight safe (1F1B, interleaved, GPipe): micro-batch j's
// forward replay writes only j's buffers, so no later forward overwrites activations that an earlier micro-batch's
// backward still needs. The output and input gradient are handed to the P2P sends as they are: the next write to
// them is the same micro-batch's replay in the next step, and every send completes before a step ends.
//
// Weight gradients accumulate inside B's graph into the GradBuffer's buckets, which never move. The loss
// multiplier (1 / (micro-batches x dp), times the fp16 loss scale) is read from a device scalar that is refilled
// when it changes, never baked into a graph.
//
// Warm-up and capture: a micro-batch index's first F and B run eagerly (NCCL communicators and cuBLAS set up) and
// record its shapes; the next step captures its graphs before its first action (before_step), when nothing of
// the step is in flight: a capture waits for every NCCL operation of the process to finish, and a receive posted
// ahead mid-step may wait for a pipeline peer that is itself waiting to capture. Graphs are captured in micro-batch
// order, F before B, so the MP ranks of a stage capture their collectives alike. A micro-batch whose shapes no
// longer match its graphs runs eagerly and is captured again at the next step's start.
//
// Not graphed (the Python side refuses or turns graphs off with one line): recomputation, deferred weight
// gradients (zero-bubble I and W), a loss other than the built-in MSE on the last stage (a micro-batch whose
// target's shape is not the output's runs eagerly).
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/stage_graph.h"
#include "executor/stage_program.h"

namespace hybrid {

class GraphedChainStage : public StageProgram {
 public:
  // eager: the native chain to graph (its chain, GradBuffer and ZeRO-1 gathers; no recomputation); it runs the
  // warm-up. device: where the graphs run. host_rerun: replay by running the recorded host code again (tests of
  // the buffers' plumbing without a GPU).
  GraphedChainStage(std::shared_ptr<NativeChainStage> eager, at::Device device, bool host_rerun = false);

  void before_step(StepLoss* loss) override;
  void release() override;
  void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) override;
  at::Tensor backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                      StepLoss* loss) override;
  bool needs_output_for_backward() const override { return false; }
  bool native() const override { return true; }
  std::string describe() const override;

  int64_t captures() const { return captures_; }  // graphs captured so far (F and B count one each)
  int64_t replays() const { return replays_; }
  int slots() const { return static_cast<int>(slots_.size()); }  // micro-batch indices with graphs or their shapes

 private:
  // What a micro-batch index's graphs are captured for: its eager run's shapes and modes.
  struct Shapes {
    std::vector<int64_t> input, target, output_grad;  // target: the last stage's; output_grad: the others'
    at::ScalarType input_dtype = at::kFloat, target_dtype = at::kFloat, output_grad_dtype = at::kFloat;
    bool last = false, want_input_grad = false, overwrite = false;
    bool operator==(const Shapes& o) const;
  };
  struct Slot {
    bool eager_in_flight = false;  // this step's F ran eagerly: so does its B
    bool graphable = true;         // false: a target of another shape than the output (the MSE graphs equal ones)
    bool recorded = false;         // `seen` holds an eager run's shapes, not yet captured
    Shapes seen;                   // the last eager run's
    Shapes captured;               // the graphs'
    std::unique_ptr<StageGraph> forward, backward;
    at::Tensor input, target, output_grad;  // static inputs (output_grad: F's loss writes it on the last stage)
    std::vector<at::Tensor> saved;          // F's activations, read by B
    at::Tensor output, loss, input_grad;    // static outputs
  };

  void wait_for_parameters() const;
  bool matches(const Slot& slot, const at::Tensor& input, const at::Tensor& target) const;
  void capture(Slot& slot);
  void set_multiplier(double multiplier);
  void announce_final() const;
  int64_t output_features() const;

  std::shared_ptr<NativeChainStage> eager_;
  at::Device device_;
  StageGraphs graphs_;
  std::map<int, Slot> slots_;  // by micro-batch index (map nodes never move: the recorded bodies hold them)
  at::Tensor multiplier_;      // 0-dim fp32 on the device: the loss multiplier the last stage's graphs read
  double multiplier_value_ = 0;
  std::vector<at::Tensor> final_order_;  // parameters, in the order the eager backward announces them final
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

}  // namespace hybrid
