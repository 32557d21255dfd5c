// y = x W^T + b as a C++ autograd function whose weight gradient can be deferred (zero-bubble "W" split).
//
// Forward is at::linear itself, so outputs match torch.nn.Linear bit for bit; so do gradients, because the
// backward runs the same GEMMs autograd's own linear backward runs (dx = g W, dW = g^T x, db = sum of g's rows).
// While WeightGradStore defers (see weight_grad_store.h), the backward returns dx only and stashes the rest.
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace hybrid {

// x: [..., in], weight: [out, in], bias: [out] or none. Under autocast the operands are cast first (through
// autocast's weight cache), and the cast weight, being no leaf, gets its gradient immediately.
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias);

}  // namespace hybrid
