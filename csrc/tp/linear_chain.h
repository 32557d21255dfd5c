// A whole pipeline stage of Linear (+ ReLU) layers, run by the executor itself with no autograd at all (the
// native stage program, executor/stage_program.h).
//
// Running a stage layer by layer through Python modules costs tens of microseconds of host time per layer and
// per autograd node; at 128-row micro-batches a layer's GPU work takes about as long, so the host, not the GPU,
// set the pace. Here the forward loops over the layers in C++ (matrix product, bias and ReLU fused where the
// backend can: at::_addmm_activation), and the backward walks them back in one pass on the calling thread (on
// CUDA that also saves the autograd engine's hand-off to its device thread and back): ReLU mask, input
// gradient, and each weight gradient either accumulated where the GradBuffer routes it or stashed for a later W
// action, exactly as hybrid::linear does for one layer.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "grad/grad_buffer.h"

namespace hybrid {

// The chain's forward: x [rows, features]; params: weight_0, bias_0, weight_1, bias_1, ... (an undefined bias
// means none); relu[i]: ReLU after layer i. Returns the output and fills `saved` with what chain_backward needs
// (a_0 = x, a_1, ..., a_n). recompute: keep only a_0 (the backward reruns the forward: activation
// recomputation, one extra forward for a stage's activations shrunk to its input). before_layer(i), when given,
// runs just before layer i reads its parameters (ZeRO-1: wait for the bucket's all-gather, no earlier).
at::Tensor chain_forward(const at::Tensor& x, at::TensorList params, const std::vector<bool>& relu, bool recompute,
                         std::vector<at::Tensor>& saved,
                         const std::function<void(size_t layer)>& before_layer = {});

// The chain's backward from the gradient of its output. Returns the input's gradient (undefined unless
// want_input_grad). Parameter gradients (for parameters that require one) are stashed for a W action when the
// buffer's store defers, else accumulated where the buffer routes them (allocated on first use) and announced
// final after their last write. Consumes `saved`.
at::Tensor chain_backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, at::TensorList params,
                          const std::vector<bool>& relu, bool recompute, bool want_input_grad, GradBuffer& grads);

}  // namespace hybrid
