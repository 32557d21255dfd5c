// The course loss, mean squared error, computed in C++ for the last pipeline stage.
//
// Computed in fp32 like mse_loss(out.float(), target.float()), bit for bit, but without its per-row memory
// (experiments/bench/memory_per_row.py): that form keeps fp32 copies of output and target from the forward to the
// backward (half weights) and returns a 0-dim loss whose storage is the whole micro-batch's fp32 unreduced loss,
// which the executor's per-micro-batch loss (loss.detach()) kept alive to the end of the step: m of them,
// 4 * dim bytes per batch row. Here at most one fp32 temporary of the output's size exists at a time, and the
// loss is a fresh scalar.
#pragma once

#include <ATen/ATen.h>

namespace hybrid {

// As an autograd function of `out` (the target gets no gradient); out and target of one shape.
at::Tensor mse_loss_autograd(const at::Tensor& out, const at::Tensor& target);

struct LossAndGrad {
  at::Tensor loss;  // fp32 scalar, before the multiplier
  at::Tensor grad;  // d(loss * multiplier) / d(out), in out's dtype
};

// Loss and output gradient at once, without autograd: the same values the autograd form gives for
// backward(loss * multiplier).
LossAndGrad mse_loss_and_grad(const at::Tensor& out, const at::Tensor& target, double multiplier);
// The same with the multiplier read from a 0-dim fp32 tensor on out's device when the kernels run (a CUDA graph
// replays with whatever the tensor holds then: the fp16 loss scale is never baked in).
LossAndGrad mse_loss_and_grad(const at::Tensor& out, const at::Tensor& target, const at::Tensor& multiplier);

}  // namespace hybrid
