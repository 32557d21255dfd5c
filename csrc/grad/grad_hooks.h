// How a gradient that autograd accumulates into param.grad reaches the GradBuffer: a C++ post-accumulate-grad hook
// on the parameter (a norm's weight, an embedding: any parameter that hybrid_engine's layers do not write
// themselves). Once autograd has summed the parameter's uses of one backward into param.grad, the hook folds it
// into the parameter's fp32 main grad when it has one (param.grad is then reset), as Megatron's main_grad hook
// does, and announces the gradient final, which lets the DP sync start the bucket's collective during the stage's
// last backward instead of after it. A parameter whose layer wrote its main grad itself has no param.grad: nothing
// to do.
//
// The hook runs inside the autograd engine: no Python per parameter and per micro-batch. It holds the buffer
// weakly: the buffer keeps its routed parameters alive, so a strong reference from their hooks would be a cycle
// that never frees either. A dead buffer's hook does nothing.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "grad/grad_buffer.h"

namespace hybrid {

// Installs the hook on every parameter (leaf tensors that require a gradient). A hook this function installed for
// another buffer is replaced (the parameters now belong to `grads`); any other post-accumulate hook already there
// (a Python one) is kept and runs first.
void install_grad_hooks(const GradBufferPtr& grads, const std::vector<at::Tensor>& params);

}  // namespace hybrid
