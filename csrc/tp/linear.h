// y = x W^T + b as a C++ autograd function whose weight gradient can be deferred (zero-bubble "W" split).
//
// Forward is at::linear itself, so outputs match torch.nn.Linear bit for bit; so do gradients, because the
// backward runs the same GEMMs autograd's own linear backward runs (dx = g W, dW = g^T x, db = sum of g's rows).
// With a GradBuffer (grad/grad_buffer.h), the weight gradient goes where the buffer routes it: stashed for a
// later W action while its store defers, else accumulated into the weight's fp32 main grad if it has one;
// otherwise (no buffer, or neither) it is returned to autograd as nn.Linear's would be.
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "grad/grad_buffer.h"

namespace hybrid {

// A linear's weight and bias gradients in its backward, from grad_2d [rows, out] and x_2d [rows, in]: stashed for a
// later W action while the buffer's store defers, accumulated into the weight's fp32 main grad when it has one
// (and announced final), or else returned for autograd (undefined where not wanted or written elsewhere).
// deferrable: the weight (and bias) are leaf parameters, kept by identity.
struct LinearParamGrads {
  at::Tensor weight, bias;
};
LinearParamGrads linear_param_grads(const at::Tensor& grad_2d, const at::Tensor& x_2d, const at::Tensor& weight,
                                    const at::Tensor& bias, bool want_weight, bool want_bias,
                                    const GradBufferPtr& grads, bool deferrable);

// x: [..., in], weight: [out, in], bias: [out] or none. Under autocast the operands are cast first (through
// autocast's weight cache), and the cast weight, being no leaf, gets its gradient immediately.
// grads: the engine's gradient buffer, or null (plain autograd gradients).
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const GradBufferPtr& grads = {});

}  // namespace hybrid
