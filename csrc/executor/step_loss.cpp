#include "executor/step_loss.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>
#include <string>

#include "executor/mse_loss.h"

namespace hybrid {

at::Tensor StepLoss::unrecorded_loss(int micro, const at::Tensor& output, const at::Tensor& target) const {
  at::Tensor loss;
  if (spec_.builtin_mse) {
    // Broadcasting shapes (with torch's warning) take the plain form; equal shapes the memory-lean one.
    loss = output.sizes() == target.sizes() ? mse_loss_autograd(output, target)
                                            : at::mse_loss(output.to(at::kFloat), target.to(at::kFloat));
  } else {
    loss = spec_.fn(output, target);
  }
  if (!loss.defined() || loss.numel() != 1) {
    throw std::runtime_error("micro-batch " + std::to_string(micro) + ": the loss function must return a scalar");
  }
  return loss;
}

at::Tensor StepLoss::checked_loss(int micro, const at::Tensor& output, const at::Tensor& target) {
  at::Tensor loss = unrecorded_loss(micro, output, target);
  losses_.at(micro) = loss.detach();
  return loss;
}

at::Tensor StepLoss::scaled_loss(int micro, const at::Tensor& output) {
  return scaled_loss(micro, output, targets_(micro));
}

at::Tensor StepLoss::scaled_loss(int micro, const at::Tensor& output, const at::Tensor& target) {
  return checked_loss(micro, output, target) * multiplier_;
}

at::Tensor StepLoss::loss_grad(int micro, const at::Tensor& output) {
  return loss_grad(micro, output, targets_(micro));
}

at::Tensor StepLoss::loss_grad(int micro, const at::Tensor& output, const at::Tensor& target) {
  if (spec_.builtin_mse && output.sizes() == target.sizes()) {
    LossAndGrad loss = mse_loss_and_grad(output, target, multiplier_);
    losses_.at(micro) = loss.loss;
    return loss.grad;
  }
  at::AutoGradMode grad_mode(true);
  at::Tensor leaf = output.detach().requires_grad_(true);
  at::Tensor scaled = checked_loss(micro, leaf, target) * multiplier_;
  if (scaled.requires_grad()) torch::autograd::backward({scaled});
  at::Tensor grad = leaf.grad();
  return grad.defined() ? grad : at::zeros_like(leaf);  // a loss that ignores the output
}

}  // namespace hybrid
