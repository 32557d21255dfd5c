// An autograd stage (a transformer's stage: any nn.Module called through Python) whose F and B (or I) are CUDA
// graphs: F the stage callable (on the last stage with the loss, multiplied by a device scalar), B torch's autograd
// from the output (or the loss) to the input, writing the weight gradients into the GradBuffer's buckets through
// the hybrid layers and the post-accumulate hooks, as the eager backward does. A replay is one launch where the
// eager stage pays a Python call and a kernel launch per operation.
//
// Zero-bubble I and W: I is captured like B but inside a DeferWeightGrads scope, so the hybrid layers stash
// (input, output gradient, weight, bias) instead of computing their weight gradients; the capture takes those
// stashes out of the store and keeps them in the slot. Their tensors are the graphs' own buffers, which every
// replay of I rewrites, so each I replay puts the slot's stashes back into the store under the replaying
// micro-batch's (stage, micro) key, and the W action, eager, flushes them as it flushes an eager stage's. The I
// graph captures into its slot's F pool, shared with no other slot, so no other graph's replay overwrites the
// stashes before their W. A slot whose backwards were I serves a whole B as well: its I, then its stashes
// flushed at once.
//
// Slots, not micro-batch indices: a slot is one set of static buffers with its F and B (or I) graphs, and its
// graphs' memory pools hold one micro-batch's activations. A micro-batch takes the lowest slot that no micro-batch
// in flight holds at its F and gives it back at its B, or at its W after an I (the stashes read the slot's
// buffers), so a stage keeps as many slots as it has micro-batches in flight at once (1F1B: at most its pipeline
// depth; one GPU: one), never one per micro-batch: graphs per index would keep every micro-batch's activations
// alive at once. The executor runs a rank's action list in order, and every MP rank of a stage runs the same list,
// so they assign, and capture, the same slots.
//
// What stays outside the graphs: the P2P sends and receives and the DP collectives (the executor's), ZeRO-1's
// parameter gathers (waited for before a capture and before every F replay, so the layers' waits inside the
// stage find nothing in flight), and the announcements that a gradient is final: the capture of B records the
// announcements its writes made (muted) and each replay makes them again, in that order. The tensor-parallel and
// sequence-parallel collectives of the layers run inside the graphs (NCCL operations on the capture stream).
//
// The output and the input gradient handed on are copies of the static ones: the slot's next micro-batch may
// replay while a send of this one still reads them. The loss recorded for the step is a copy too.
//
// Warm-up and capture: a slot's first micro-batch runs eagerly (the Python stage, torch.compile's compilation,
// cuBLAS and NCCL set up) and records its shapes; the next step captures the slot's graphs before its first action
// (before_step), when nothing of the step is in flight, slot by slot, F before B (as I where any of the slot's
// eager backwards in that step was an I). A micro-batch whose shapes the slot's graphs were not captured for runs
// eagerly; the shapes of the step's first such micro-batch in the slot are captured at the next step's start
// unless the slot's graphs were replayed in this step (a smaller last micro-batch runs eagerly and does not
// recapture every step).
//
// Random numbers: torch's CUDA graph registers the default CUDA generator's state at capture, so a dropout inside
// a replay draws fresh numbers each replay (not eager's numbers); a generator of the stage's own is not registered.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "executor/dp_param_gather.h"
#include "executor/stage_graph.h"
#include "executor/stage_program.h"
#include "grad/grad_buffer.h"

namespace hybrid {

class GraphedAutogradStage : public StageProgram {
 public:
  // eager: the stage to graph (it runs the warm-up and every micro-batch the graphs do not fit). grads: the
  // engine's GradBuffer. params, param_gather: ZeRO-1's overlapped gathers of the stage's parameters, waited for
  // before a capture and each F replay (param_gather null: none). device: where the graphs run; host_rerun:
  // replay by running the recorded host code again (tests of the plumbing without a GPU).
  GraphedAutogradStage(std::shared_ptr<AutogradStage> eager, GradBufferPtr grads, std::vector<at::Tensor> params,
                       std::shared_ptr<DpParamGather> param_gather, at::Device device, bool host_rerun = false);

  void before_step(StepLoss* loss) override;
  void release() override;
  void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) override;
  at::Tensor backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                      StepLoss* loss) override;
  void after_weight_grads(int micro) override;
  bool needs_output_for_backward() const override { return false; }
  bool native() const override { return false; }
  std::string describe() const override;

  int64_t captures() const { return captures_; }  // graphs captured so far (F and B or I count one each)
  int64_t replays() const { return replays_; }
  int64_t stashed() const { return stashed_; }  // weight-gradient stashes its I replays left for the W actions
  int slots() const { return static_cast<int>(slots_.size()); }
  // The slot each micro-batch of the latest step took (-1: none), by micro-batch index.
  const std::vector<int>& slot_of_micro() const { return slot_of_micro_; }

 private:
  // What a slot's graphs are captured for: its eager run's shapes.
  struct Shapes {
    std::vector<int64_t> input, target, output_grad;  // target: the last stage's; output_grad: the others'
    at::ScalarType input_dtype = at::kFloat, target_dtype = at::kFloat, output_grad_dtype = at::kFloat;
    bool first = false, last = false;
    bool deferred = false;  // the backward to capture is an I (weight gradients deferred), not a B
    bool operator==(const Shapes& o) const;
  };
  struct Slot {
    int index = 0;
    bool recorded = false;  // `seen` holds the step's first eager F and B's shapes, not yet captured
    bool replayed = false;  // its graphs were replayed in this step
    Shapes seen;            // the last eager run's
    Shapes captured;        // the graphs'
    std::unique_ptr<StageGraph> forward, backward;  // backward: B, or I (captured.deferred)
    at::Tensor input, target, output_grad;         // static inputs
    at::Tensor output, loss, root, input_grad;     // static outputs (root: the output, or the multiplied loss)
    std::vector<at::Tensor> finals;                // the backward's final-gradient announcements, in order
    std::vector<WgradEntry> stash;                 // I's deferred weight gradients, over the graphs' buffers
  };
  struct InFlight {
    Slot* slot;
    bool eager;
    bool awaiting_w = false;  // its I ran: the slot is held until its W
  };

  Slot& free_slot();
  bool matches(const Slot& slot, const at::Tensor& input, const at::Tensor& target, bool first_stage) const;
  void wait_for_parameters() const;
  void set_multiplier(double multiplier);
  void capture(Slot& slot);

  std::shared_ptr<AutogradStage> eager_;
  GradBufferPtr grads_;
  std::vector<at::Tensor> params_;
  std::shared_ptr<DpParamGather> param_gather_;
  at::Device device_;
  StageGraphs graphs_;
  std::vector<std::unique_ptr<Slot>> slots_;  // owned one by one: the recorded bodies hold them
  std::map<int, InFlight> in_flight_;         // by micro-batch index
  std::vector<int> slot_of_micro_;
  StepLoss* loss_ = nullptr;  // the running step's (the last stage's bodies compute their loss with its spec)
  at::Tensor multiplier_;     // 0-dim fp32 on the device: the loss multiplier the last stage's graphs read
  double multiplier_value_ = 0;
  int64_t captures_ = 0;
  int64_t replays_ = 0;
  int64_t stashed_ = 0;
};

}  // namespace hybrid
