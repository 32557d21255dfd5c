#include "grad/accumulate.h"

#include <ATen/ExpandUtils.h>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/add_half.cu: target (fp32, contiguous) += src (fp16 or bf16, contiguous, as many elements).
void add_half_into_float_cuda(const at::Tensor& target, const at::Tensor& src);
#endif

void add_into(at::Tensor& target, const at::Tensor& grad) {
#ifdef HYBRID_WITH_CUDA
  const bool half = grad.scalar_type() == at::kHalf || grad.scalar_type() == at::kBFloat16;
  if (target.is_cuda() && grad.device() == target.device() && target.scalar_type() == at::kFloat && half &&
      target.sizes() == grad.sizes() && target.is_contiguous() && grad.is_contiguous()) {
    add_half_into_float_cuda(target, grad);
    return;
  }
#endif
  target.add_(grad);
}

void addmm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d) {
  if (target.scalar_type() == grad_output_2d.scalar_type()) {
    target.addmm_(grad_output_2d.t(), input_2d);
  } else if (target.is_cuda()) {
    // One GEMM: half operands, fp32 accumulate and output, added in place (no half-precision temporary).
    at::addmm_out(target, target, grad_output_2d.t(), input_2d, target.scalar_type());
  } else {
    target.addmm_(grad_output_2d.t().to(target.scalar_type()), input_2d.to(target.scalar_type()));
  }
}

void add_bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d) {
  target.add_(at::sum(grad_output_2d, {0}, /*keepdim=*/false, target.scalar_type()));
}

void mm_into(at::Tensor& target, const at::Tensor& grad_output_2d, const at::Tensor& input_2d) {
  if (target.scalar_type() == grad_output_2d.scalar_type()) {
    at::mm_out(target, grad_output_2d.t(), input_2d);
  } else if (target.is_cuda()) {
    // beta = 0: the GEMM never reads the old gradient
    at::addmm_out(target, target, grad_output_2d.t(), input_2d, target.scalar_type(), /*beta=*/0, /*alpha=*/1);
  } else {
    at::mm_out(target, grad_output_2d.t().to(target.scalar_type()), input_2d.to(target.scalar_type()));
  }
}

void bias_grad_into(at::Tensor& target, const at::Tensor& grad_output_2d) {
  at::sum_out(target, grad_output_2d, {0}, /*keepdim=*/false, target.scalar_type());
}

at::Tensor linear_weight_grad(const at::Tensor& grad_output_2d, const at::Tensor& input_2d) {
  return grad_output_2d.t().mm(input_2d);
}

at::Tensor linear_bias_grad(const at::Tensor& grad_output_2d, const at::Tensor& bias) {
  return at::sum_to(grad_output_2d, bias.sizes());
}

void assign_grad(at::Tensor& target, const at::Tensor& param, at::Tensor grad) {
  if (grad.strides() != param.strides() && param.is_non_overlapping_and_dense()) {
    at::Tensor laid_out = at::empty_strided(param.sizes(), param.strides(), grad.options());
    laid_out.copy_(grad);
    grad = laid_out;
  }
  target = grad;
}

}  // namespace hybrid
