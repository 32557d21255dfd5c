// A whole pipeline stage of Linear (+ ReLU) layers as ONE autograd node.
//
// Running a stage layer by layer through Python modules costs tens of microseconds of host time per layer and
// per autograd node; at 128-row micro-batches a layer's GPU work takes about as long, so the host, not the GPU,
// set the pace. Here the forward loops over the layers in C++ (matrix product, bias and ReLU fused where
// the backend can: at::_addmm_activation), and the backward walks them back in one node: ReLU mask, input
// gradient, and each weight gradient either returned, accumulated into an fp32 main grad (main_grad.h) or
// stashed for a later W action (weight_grad_store.h), exactly as hybrid::linear does for one layer.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace hybrid {

// params: weight_0, bias_0, weight_1, bias_1, ... (an undefined bias means none); relu[i]: ReLU after layer i.
// recompute: keep only the stage input alive until the backward, which reruns the forward (activation
// recomputation: one extra forward for a stage's activations shrunk to its input).
at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& params, const std::vector<bool>& relu,
                        bool recompute = false);

}  // namespace hybrid
