// Megatron's column- and row-parallel linear layers (Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053), each
// one C++ autograd function with its MP collective inside, so that the collective can run under the layer's own
// GEMMs instead of waiting in a separate graph node:
//
//   column_parallel_linear  forward: (sequence parallel: all-gather x along the sequence) then x W^T + b on this
//                           rank's slice of the output features. Backward: the input gradient's GEMM first; its
//                           all-reduce (sequence parallel: reduce-scatter along the sequence) starts at once and
//                           the weight gradient's GEMM runs while it travels (Megatron's asynchronous gradient
//                           all-reduce); then the wait.
//   row_parallel_linear     forward: x W^T on this rank's slice of the input features, summed over MP: all-reduce
//                           (sequence parallel: reduce-scatter along the sequence). No bias: the caller adds it
//                           after the sum, once. Backward: the output gradient (sequence parallel: all-gathered
//                           along the sequence) into both GEMMs; nothing else to overlap with.
//
// Weight gradients go where hybrid::linear sends them (tp/linear.h): stashed for a zero-bubble W, into an fp32
// main grad, or to autograd. On NCCL a wait only makes the compute stream wait, so the host never blocks.
// A trivial group makes both plain hybrid::linear. trace (may be null): the collectives are recorded there as MP
// spans labelled `layer`. All members of the group must call them in the same order, with the same shapes.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>

#include "comm/collectives.h"
#include "comm/comm_trace.h"
#include "grad/grad_buffer.h"

namespace hybrid {

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  const GradBufferPtr& grads, const GroupPtr& group, bool sequence_parallel,
                                  const std::shared_ptr<CommTrace>& trace = nullptr, int64_t layer = 0);

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const GradBufferPtr& grads,
                               const GroupPtr& group, bool sequence_parallel,
                               const std::shared_ptr<CommTrace>& trace = nullptr, int64_t layer = 0);

}  // namespace hybrid
