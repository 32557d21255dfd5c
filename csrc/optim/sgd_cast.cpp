#include "optim/sgd_cast.h"

#include <c10/util/Exception.h>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/sgd_cast.cu: one vectorised kernel per tensor.
void sgd_step_and_cast_cuda(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, float lr);
#endif

namespace {

void check_pair(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, size_t i) {
  TORCH_CHECK(master.scalar_type() == at::kFloat && grad.scalar_type() == at::kFloat,
              "sgd_step_and_cast: master and grad ", i, " must be float32, got ", master.scalar_type(), " and ",
              grad.scalar_type());
  TORCH_CHECK(master.sizes() == grad.sizes() && master.sizes() == half.sizes(), "sgd_step_and_cast: tensor ", i,
              " has mismatched shapes ", master.sizes(), ", ", grad.sizes(), ", ", half.sizes());
  TORCH_CHECK(master.device() == grad.device() && master.device() == half.device(), "sgd_step_and_cast: tensor ", i,
              " spans devices");
}

}  // namespace

void sgd_step_and_cast(const std::vector<at::Tensor>& masters, const std::vector<at::Tensor>& grads,
                       const std::vector<at::Tensor>& halves, double lr) {
  TORCH_CHECK(masters.size() == grads.size() && masters.size() == halves.size(),
              "sgd_step_and_cast: ", masters.size(), " masters, ", grads.size(), " grads, ", halves.size(), " halves");
  for (size_t i = 0; i < masters.size(); ++i) {
    const at::Tensor& master = masters[i];
    const at::Tensor& grad = grads[i];
    const at::Tensor& half = halves[i];
    if (!grad.defined()) continue;  // a parameter without a gradient keeps its value, as in torch.optim.SGD
    check_pair(master, grad, half, i);
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
