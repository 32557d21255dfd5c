// The last pipeline stage's loss for one step: the targets, the loss itself, the multiplier and where each
// micro-batch's loss goes. A stage program asks it either for a graph root (autograd stages) or for the output's
// gradient with no graph kept (native stages).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

namespace hybrid {

// What the engine's loss is, as a value (hybrid_engine/models/losses.py): the built-in mean squared error, which runs in
// C++ (executor/mse_loss.h: no Python on the last stage's critical path, the output's gradient computed together
// with the loss, no per-row memory), or any callable (output, target) -> scalar.
struct LossSpec {
  using Fn = std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;
  bool builtin_mse = false;
  Fn fn;  // when not builtin_mse
};

class StepLoss {
 public:
  using MicroBatchFn = std::function<at::Tensor(int micro)>;

  // multiplier: what each micro-batch's loss is multiplied by before its backward (1 / (micro-batches x dp),
  // times the fp16 loss scale). losses[micro] receives the unmultiplied loss, detached.
  StepLoss(const LossSpec& spec, const MicroBatchFn& targets, double multiplier, std::vector<at::Tensor>& losses)
      : spec_(spec), targets_(targets), multiplier_(multiplier), losses_(losses) {}

  // Through autograd: the micro-batch's loss times the multiplier, a root for torch::autograd::backward.
  at::Tensor scaled_loss(int micro, const at::Tensor& output);
  // The same with the micro-batch's target already drawn (by a caller that had to see it first).
  at::Tensor scaled_loss(int micro, const at::Tensor& output, const at::Tensor& target);
  // d(loss x multiplier) / d(output), keeping no graph. The built-in MSE computes it with the loss; any other
  // loss runs through autograd from the output (a fresh leaf) to the loss only.
  at::Tensor loss_grad(int micro, const at::Tensor& output);
  // The same with the micro-batch's target already drawn (by a caller that had to see it first).
  at::Tensor loss_grad(int micro, const at::Tensor& output, const at::Tensor& target);

  // For a program that computes the loss itself (a CUDA-graphed stage, with the built-in MSE): the spec, the
  // multiplier, the micro-batch's target, and where its unmultiplied loss goes.
  const LossSpec& spec() const { return spec_; }
  double multiplier() const { return multiplier_; }
  at::Tensor target(int micro) const { return targets_(micro); }
  void record(int micro, at::Tensor loss) { losses_.at(micro) = std::move(loss); }
  // The unmultiplied loss through autograd, checked to be a scalar and not recorded (a graph's capture computes
  // it once and records each replay's value itself).
  at::Tensor unrecorded_loss(int micro, const at::Tensor& output, const at::Tensor& target) const;

 private:
  at::Tensor checked_loss(int micro, const at::Tensor& output, const at::Tensor& target);  // recorded

  const LossSpec& spec_;
  const MicroBatchFn& targets_;
  double multiplier_;
  std::vector<at::Tensor>& losses_;
};

}  // namespace hybrid
