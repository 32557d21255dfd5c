// fp32 gradient accumulation for half-precision weights ("main grads", as Megatron calls them).
//
// With weights kept in fp16/bf16 for the whole step, letting autograd accumulate their gradients would sum
// every micro-batch's contribution in half precision. Instead the engine registers an fp32 buffer per weight;
// hybrid::linear's backward (and the deferred-W flush) then write each weight gradient straight into it with
// a GEMM that reads half inputs and accumulates in fp32 (CUDA), and leave the parameter's own .grad alone.
#pragma once

#include <ATen/ATen.h>

namespace hybrid {

// Route `param`'s gradient into `buffer` (same shape, any float dtype) from now on.
void set_main_grad(const at::Tensor& param, const at::Tensor& buffer);
// The registered buffer, or nullptr when `param` has none.
at::Tensor* find_main_grad(const at::Tensor& param);
void clear_main_grads();

// target += a^T b with target's dtype for the sum (fp32 output from half inputs on CUDA in one GEMM).
void addmm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
// target += rows of grad_output summed, summed in target's dtype.
void add_bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d);
// The same two, overwriting target instead of adding to it (no read of its old value, no zeroing needed).
void mm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
void bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d);

}  // namespace hybrid
