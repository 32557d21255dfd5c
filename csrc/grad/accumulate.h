// The GEMMs that write weight gradients where they live: added to, or overwriting, an existing gradient tensor
// of any float dtype (an fp32 main grad for half weights: half inputs, fp32 accumulation, one GEMM on CUDA).
// Stateless: which tensor a parameter's gradient lives in is the GradBuffer's business (grad/grad_buffer.h).
#pragma once

#include <ATen/ATen.h>

namespace hybrid {

// target += a^T b with target's dtype for the sum (fp32 output from half inputs on CUDA in one GEMM).
void addmm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
// target += rows of grad_output summed, summed in target's dtype.
void add_bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d);
// The same two, overwriting target instead of adding to it (no read of its old value, no zeroing needed).
void mm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
void bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d);

// dW = grad_output^T input for [rows, out] and [rows, in]; the same GEMM autograd's addmm/mm backward runs.
at::Tensor linear_weight_grad(const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
// db = grad_output summed over rows, reduced as autograd reduces a broadcast bias.
at::Tensor linear_bias_grad(const at::Tensor& grad_output_2d, const at::Tensor& bias);

// target += grad, summed in target's dtype: an fp32 main grad plus a half gradient (both contiguous, on CUDA) in
// one vectorized pass (csrc/cuda/add_half.cu), else add_; equal to add_ bit for bit either way.
void add_into(at::Tensor& target, const at::Tensor& grad);

// A parameter's first gradient: laid out like the parameter, as autograd's AccumulateGrad makes it.
void assign_grad(at::Tensor& target, const at::Tensor& param, at::Tensor grad);

}  // namespace hybrid
