#include "executor/mse_loss.h"

#include <torch/csrc/autograd/custom_function.h>

namespace hybrid {

namespace {

at::Tensor difference(const at::Tensor& out, const at::Tensor& target) {
  return out.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true).sub_(target);
}

// mse_loss_backward: (2 / numel) * (a - b) * grad, in fp32, then the cast to out's dtype. `diff` is consumed;
// `grad` is a 0-dim fp32 tensor (on the device, or a CPU scalar: no sync either way).
at::Tensor output_grad(at::Tensor diff, const at::Tensor& out, const at::Tensor& grad) {
  diff.mul_(2.0 / static_cast<double>(out.numel())).mul_(grad);
  return diff.to(out.scalar_type());
}

struct Mse : public torch::autograd::Function<Mse> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& out, const at::Tensor& target) {
    ctx->save_for_backward({out, target});
    at::Tensor d = difference(out, target);
    return d.mul_(d).mean();  // mse_loss: mean of (a - b)^2
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {output_grad(difference(saved[0], saved[1]), saved[0], grads[0]), at::Tensor()};
  }
};

}  // namespace

at::Tensor mse_loss_autograd(const at::Tensor& out, const at::Tensor& target) { return Mse::apply(out, target); }

LossAndGrad mse_loss_and_grad(const at::Tensor& out, const at::Tensor& target, double multiplier) {
  // backward(loss * multiplier) hands the loss node the fp32 product 1 * multiplier.
  return mse_loss_and_grad(out, target, at::scalar_tensor(multiplier, at::kFloat));
}

LossAndGrad mse_loss_and_grad(const at::Tensor& out, const at::Tensor& target, const at::Tensor& multiplier) {
  at::Tensor d = difference(out, target);
  at::Tensor loss = at::mul(d, d).mean();
  return {loss, output_grad(std::move(d), out, multiplier)};
}

}  // namespace hybrid
