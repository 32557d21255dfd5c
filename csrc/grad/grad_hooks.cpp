#include "grad/grad_hooks.h"

#include "grad/accumulate.h"

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <utility>

namespace hybrid {

namespace {

using torch::autograd::PostAccumulateGradHook;

class GradBufferHook final : public PostAccumulateGradHook {
 public:
  GradBufferHook(const GradBufferPtr& grads, std::unique_ptr<PostAccumulateGradHook> earlier)
      : grads_(grads), earlier_(std::move(earlier)) {}

  void operator()(const torch::autograd::Variable& param) override {
    if (earlier_) (*earlier_)(param);
    at::Tensor& grad = param.mutable_grad();
    if (!grad.defined()) return;  // the layer wrote its main grad itself
    GradBufferPtr grads = grads_.lock();
    if (!grads) return;
    if (grads->has_main_grad(param)) {
      add_into(grads->grad_target(param), grad);
      grad.reset();
    }
    grads->grad_final(param);
  }

  std::unique_ptr<PostAccumulateGradHook> take_earlier() { return std::move(earlier_); }

 private:
  c10::weak_intrusive_ptr<GradBuffer> grads_;
  std::unique_ptr<PostAccumulateGradHook> earlier_;
};

}  // namespace

void install_grad_hooks(const GradBufferPtr& grads, const std::vector<at::Tensor>& params) {
  TORCH_CHECK(grads, "install_grad_hooks: no GradBuffer");
  for (const at::Tensor& param : params) {
    TORCH_CHECK(param.is_leaf() && param.requires_grad(),
                "install_grad_hooks: a gradient hook goes on a parameter (a leaf that requires a gradient)");
    std::unique_ptr<PostAccumulateGradHook> earlier = std::move(torch::autograd::impl::post_acc_grad_hooks(param));
    if (auto* ours = dynamic_cast<GradBufferHook*>(earlier.get())) earlier = ours->take_earlier();
    torch::autograd::impl::set_post_acc_grad_hooks(param,
                                                   std::make_unique<GradBufferHook>(grads, std::move(earlier)));
  }
}

}  // namespace hybrid
