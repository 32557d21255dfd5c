#include "tp/main_grad.h"

#include <mutex>
#include <unordered_map>

namespace hybrid {

namespace {

struct Registry {
  std::mutex mutex;
  // Keyed by the parameter's TensorImpl; the parameter itself is kept so the key cannot be reused.
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> buffers;
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void set_main_grad(const at::Tensor& param, const at::Tensor& buffer) {
  TORCH_CHECK(param.sizes() == buffer.sizes(), "main grad of shape ", buffer.sizes(), " for a parameter of shape ",
              param.sizes());
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.buffers[param.unsafeGetTensorImpl()] = {param, buffer};
}

at::Tensor* find_main_grad(const at::Tensor& param) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.buffers.find(param.unsafeGetTensorImpl());
  return it == r.buffers.end() ? nullptr : &it->second.second;
}

void clear_main_grads() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.buffers.clear();
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

}  // namespace hybrid
