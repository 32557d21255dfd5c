// A stage program: what the pipeline executor runs for one stage's F, B and I actions (W, the deferred weight
// gradients, is the GradBuffer's flush and the same for every program; the program hears when it is done). Two
// implementations:
//
//   NativeChainStage  a chain of Linear (+ ReLU) layers run by C++ with no autograd (tp/linear_chain.h), on one
//                     rank or tensor-parallel over the MP group; with the built-in MSE on the last stage the
//                     output's gradient is computed with the loss.
//   AutogradStage     any nn.Module, called through Python; its backward is torch's autograd from the stage
//                     output (or the loss) to the stage input. Autocast, recomputation and torch.compile live
//                     inside the callable (hybrid_engine/parallel/pipeline/stages.py).
//
// Both defer weight gradients the same way: inside an I action the executor holds a DeferWeightGrads scope on
// the engine's GradBuffer store, and every hybrid layer stashes instead of computing.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "executor/dp_param_gather.h"
#include "executor/step_loss.h"
#include "grad/grad_buffer.h"
#include "tp/linear_chain.h"

namespace hybrid {

// What the executor keeps of one micro-batch on one stage between its F and its B (or I).
struct MicroState {
  bool forwarded = false;
  at::Tensor input;       // autograd: the stage input (a leaf that collects its gradient)
  at::Tensor output;      // the stage output until sent (autograd: the backward's root)
  at::Tensor loss;        // autograd, last stage: the multiplied loss, the backward's root
  at::Tensor input_grad;  // the gradient to send upstream
  // Native: what chain_backward needs; on the last stage the output's gradient (computed with the loss); with
  // recompute on the last stage the whole forward waits for the backward (`saved` holds the input only).
  std::vector<at::Tensor> saved;
  at::Tensor output_grad;
  bool forward_deferred = false;
  std::vector<int64_t> input_sizes;  // native, for an input of more than 2 dims (flattened to rows)
};

class StageProgram {
 public:
  virtual ~StageProgram() = default;
  // F for one micro-batch. `input`: the received activation, or the first stage's micro-batch. `loss`: given on
  // the last stage, which computes its micro-batch's loss (or defers it); elsewhere the program sets s.output.
  virtual void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) = 0;
  // B or I from the received output gradient (undefined on the last stage, where `loss` is given). Returns the
  // input's gradient (undefined on the first stage) and drops what the micro-batch kept.
  virtual at::Tensor backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                              StepLoss* loss) = 0;
  // Called by the executor at the start of every step, before its first action: nothing of the step is in
  // flight yet (a CUDA-graphed stage captures its graphs here: a capture waits for every NCCL operation of the
  // process to finish, and a pipeline peer's operations posted ahead could wait for this rank). `loss`: the
  // step's, on the rank that holds the last stage (a graphed last stage captures its loss), else null.
  virtual void before_step(StepLoss* /*loss*/) {}
  // Called by the executor once micro-batch `micro`'s deferred weight gradients (its I's stashes) are computed:
  // what the stashes read may be reused from here (a CUDA-graphed stage's slot, whose buffers they are).
  virtual void after_weight_grads(int /*micro*/) {}
  // Frees what the program recorded to replay (a CUDA-graphed stage's graphs, their memory pools and static
  // buffers); the next micro-batch runs eagerly and records afresh. NCCL does not destroy a communicator while a
  // graph that captured its collectives lives, so a graphed stage is released before its groups are destroyed,
  // whoever still holds the program. The caller makes sure no replay is queued.
  virtual void release() {}
  // Whether the backward needs s.output (else SEND_F drops it once the transfer holds it).
  virtual bool needs_output_for_backward() const = 0;
  virtual bool native() const = 0;
  virtual std::string describe() const = 0;
};

class NativeChainStage : public StageProgram {
 public:
  // param_gather (ZeRO-1 with the all-gather overlapped, else null): each layer's forward first waits for its
  // parameters' gather.
  NativeChainStage(LinearChain chain, bool recompute, GradBufferPtr grads,
                   std::shared_ptr<DpParamGather> param_gather = nullptr);
  void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) override;
  // The last stage's F with its micro-batch's target already drawn (by a caller that had to see it first).
  void forward(MicroState& s, int micro, const at::Tensor& input, StepLoss& loss, const at::Tensor& target);
  at::Tensor backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                      StepLoss* loss) override;
  bool needs_output_for_backward() const override { return false; }
  bool native() const override { return true; }
  std::string describe() const override;
  const LinearChain& chain() const { return chain_; }
  bool recompute() const { return recompute_; }
  const GradBufferPtr& grads() const { return grads_; }
  const std::shared_ptr<DpParamGather>& param_gather() const { return param_gather_; }

 private:
  at::Tensor run_forward(const at::Tensor& rows, bool recompute, std::vector<at::Tensor>& saved,
                         const std::vector<int64_t>& input_sizes) const;
  // F; `target` undefined: drawn from the loss when needed.
  void forward_drawn(MicroState& s, int micro, const at::Tensor& input, StepLoss* loss, const at::Tensor& target);

  LinearChain chain_;
  bool recompute_;
  GradBufferPtr grads_;
  std::shared_ptr<DpParamGather> param_gather_;
};

// Whether an autograd stage's input collects its gradient for upstream (made a leaf that requires it): a received
// floating activation does; the first stage's input (e.g. integer tokens) needs none.
inline bool input_collects_grad(bool first_stage, at::ScalarType dtype) {
  return !first_stage && at::isFloatingType(dtype);
}

class AutogradStage : public StageProgram {
 public:
  using Fn = std::function<at::Tensor(const at::Tensor& input)>;
  AutogradStage(Fn fn, std::string description) : fn_(std::move(fn)), description_(std::move(description)) {}
  void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) override;
  // The last stage's F with its micro-batch's target already drawn (by a caller that had to see it first).
  void forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss& loss,
               const at::Tensor& target);
  at::Tensor backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                      StepLoss* loss) override;
  bool needs_output_for_backward() const override { return true; }
  const Fn& fn() const { return fn_; }
  bool native() const override { return false; }
  std::string describe() const override { return description_; }

 private:
  Fn fn_;
  std::string description_;
};

}  // namespace hybrid
