// A whole pipeline stage of Linear (+ ReLU) layers as ONE autograd node, or with no autograd at all.
//
// Running a stage layer by layer through Python modules costs tens of microseconds of host time per layer and
// per autograd node; at 128-row micro-batches a layer's GPU work takes about as long, so the host, not the GPU,
// set the pace. Here the forward loops over the layers in C++ (matrix product, bias and ReLU fused where
// the backend can: at::_addmm_activation), and the backward walks them back in one pass: ReLU mask, input
// gradient, and each weight gradient either returned, accumulated into an fp32 main grad (main_grad.h) or
// stashed for a later W action (weight_grad_store.h), exactly as hybrid::linear does for one layer.
//
// The pipeline executor can also call chain_forward / chain_backward directly (a "native" stage): then no
// autograd graph is built and the backward runs on the calling thread, which on CUDA saves the autograd
// engine's hand-off to its device thread and back on every backward action (csrc/executor).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace hybrid {

// params: weight_0, bias_0, weight_1, bias_1, ... (an undefined bias means none); relu[i]: ReLU after layer i.
// recompute: keep only the stage input alive until the backward, which reruns the forward (activation
// recomputation: one extra forward for a stage's activations shrunk to its input).
at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& params, const std::vector<bool>& relu,
                        bool recompute = false);

// The chain's forward without autograd: returns the output and fills `saved` with what chain_backward needs
// (a_0 = x, a_1, ..., a_n; only a_0 with recompute, and then no layer output outlives the next layer).
at::Tensor chain_forward(const at::Tensor& x, at::TensorList params, const std::vector<bool>& relu, bool recompute,
                         std::vector<at::Tensor>& saved);

// The chain's backward without autograd, from the gradient of its output. Returns the input's gradient
// (undefined unless want_input_grad). Parameter gradients (for parameters that require one) are stashed for a
// W action when the WeightGradStore defers, else accumulated where they live (grad_target, allocated on first
// use) and announced final (grad_final) after their last write. Consumes `saved`.
at::Tensor chain_backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, at::TensorList params,
                          const std::vector<bool>& relu, bool recompute, bool want_input_grad);

}  // namespace hybrid
