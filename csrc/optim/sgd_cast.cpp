#include "optim/sgd_cast.h"

#include <stdexcept>
#include <string>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/sgd_cast.cu: one vectorised kernel per tensor.
void sgd_step_and_cast_cuda(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, float lr);
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

}  // namespace

void check_sgd_step_and_cast(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
                             const std::vector<at::Tensor>& halves) {
  if (masters.size() != grads.size() || masters.size() != halves.size()) {
    throw std::invalid_argument("sgd_step_and_cast: " + std::to_string(masters.size()) + " masters, " +
                                std::to_string(grads.size()) + " grads, " + std::to_string(halves.size()) +
                                " halves");
  }
  for (size_t i = 0; i < masters.size(); ++i) {
    if (grads[i].defined()) check_pair(masters[i], grads[i], halves[i], i);
  }
}

void sgd_step_and_cast(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& halves, double lr) {
  check_sgd_step_and_cast(masters, grads, halves);
  for (size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& master = masters[i];
    const at::Tensor& grad = grads[i];
    const at::Tensor& half = halves[i];
    if (!grad.defined()) continue;  // a parameter without a gradient keeps its value, as in torch.optim.SGD
#ifdef HYBRID_WITH_CUDA
    if (master.is_cuda() && master.is_contiguous() && grad.is_contiguous() && half.is_contiguous()) {
      sgd_step_and_cast_cuda(master, grad, half, static_cast<float>(lr));
      continue;
    }
#endif
    // Elsewhere (CPU, strided tensors): the same arithmetic as torch's SGD, then the cast.
    master.add_(grad, -lr);
    half.copy_(master);
  }
}

}  // namespace hybrid
