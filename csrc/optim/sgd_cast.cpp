#include "optim/sgd_cast.h"

#include <stdexcept>
#include <string>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/sgd_cast.cu: one vectorised kernel per tensor. skip_if: null, or a device pointer to the flag.
void sgd_step_and_cast_cuda(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, float lr,
                            float inv_scale, const float* skip_if);
#endif

namespace {

void check_pair(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, size_t i) {
  const std::string which = "sgd_step_and_cast: tensor " + std::to_string(i);
  if (master.scalar_type() != at::kFloat || grad.scalar_type() != at::kFloat) {
    throw std::invalid_argument(which + ": master and grad must be float32, got " +
                                std::string(c10::toString(master.scalar_type())) + " and " +
                                c10::toString(grad.scalar_type()));
  }
  if (master.sizes() != grad.sizes() || master.sizes() != half.sizes()) {
    throw std::invalid_argument(which + " has mismatched shapes");
  }
  if (master.device() != grad.device() || master.device() != half.device()) {
    throw std::invalid_argument(which + " spans devices");
  }
}

void check_skip_if(const at::Tensor& skip_if) {
  if (skip_if.scalar_type() != at::kFloat || skip_if.numel() != 1) {
    throw std::invalid_argument("sgd_step_and_cast: skip_if must be a float32 tensor of one element, got " +
                                std::string(c10::toString(skip_if.scalar_type())) + " with " +
                                std::to_string(skip_if.numel()) + " elements");
  }
}

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// The same arithmetic with ATen ops: CPU tensors, strided CUDA tensors. `skip` (undefined, or a flag on the
// tensors' device) is applied with where(), so a device flag is never read by the host.
void sgd_step_and_cast_aten(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, double lr,
                            float inv_scale, const at::Tensor& skip) {
  // mul by a scalar rounds float(grad * inv_scale) in fp32, as the AMP unscale kernel does; by 1 it is exact,
  // and skipping it keeps the plain step free of a temporary.
  const at::Tensor g = inv_scale == 1.0f ? grad : grad.mul(static_cast<double>(inv_scale));
  if (!skip.defined()) {
    master.add_(g, -lr);  // torch's SGD arithmetic, then the cast
    half.copy_(master);
    return;
  }
  const at::Tensor keep = skip.reshape({}).ne(0);  // 0-dim: broadcasts to any shape
  const at::Tensor stepped = master.add(g, -lr);
  half.copy_(at::where(keep, half, stepped));  // half -> fp32 -> half is exact, so a kept half is unchanged
  master.copy_(at::where(keep, master, stepped));
}

}  // namespace

void check_sgd_step_and_cast(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
                             const std::vector<at::Tensor>& halves, const std::optional<at::Tensor>& skip_if) {
  if (masters.size() != grads.size() || masters.size() != halves.size()) {
    throw std::invalid_argument("sgd_step_and_cast: " + std::to_string(masters.size()) + " masters, " +
                                std::to_string(grads.size()) + " grads, " + std::to_string(halves.size()) +
                                " halves");
  }
  if (given(skip_if)) check_skip_if(*skip_if);
  for (size_t i = 0; i < masters.size(); ++i) {
    if (!grads[i].defined()) continue;
    check_pair(masters[i], grads[i], halves[i], i);
    if (given(skip_if) && skip_if->device() != masters[i].device()) {
      throw std::invalid_argument("sgd_step_and_cast: skip_if is on " + skip_if->device().str() + " but tensor " +
                                  std::to_string(i) + " is on " + masters[i].device().str());
    }
  }
}

void sgd_step_and_cast(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& halves, double lr, double inv_scale,
                       const std::optional<at::Tensor>& skip_if) {
  check_sgd_step_and_cast(masters, grads, halves, skip_if);
  at::Tensor skip = given(skip_if) ? *skip_if : at::Tensor();
  // On the CPU reading the flag costs nothing, and a skipped step then touches nothing at all.
  if (skip.defined() && skip.is_cpu()) {
    if (skip.item<float>() != 0.0f) return;  // NaN too: a flag that is not a clean 0 never lets a step through
    skip = at::Tensor();
  }
  const auto inv = static_cast<float>(inv_scale);
  for (size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& master = masters[i];
    const at::Tensor& grad = grads[i];
    const at::Tensor& half = halves[i];
    if (!grad.defined()) continue;  // a parameter without a gradient keeps its value, as in torch.optim.SGD
#ifdef HYBRID_WITH_CUDA
    if (master.is_cuda() && master.is_contiguous() && grad.is_contiguous() && half.is_contiguous()) {
      sgd_step_and_cast_cuda(master, grad, half, static_cast<float>(lr), inv,
                             skip.defined() ? skip.const_data_ptr<float>() : nullptr);
      continue;
    }
#endif
    sgd_step_and_cast_aten(master, grad, half, lr, inv, skip);
  }
}

}  // namespace hybrid
