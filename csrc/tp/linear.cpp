#include "tp/linear.h"

#include "tp/main_grad.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tp/weight_grad_store.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias) {
    at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    ctx->save_for_backward({x, weight, b});
    // Leaf-ness is a property of the caller's graph, visible only here.
    ctx->saved_data["deferrable"] = weight.is_leaf() && (!b.defined() || b.is_leaf());
    return at::linear(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& bias = saved[2];
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};

    const int64_t out_features = weight.size(0);
    const int64_t in_features = weight.size(1);
    at::Tensor grad_2d = grad.reshape({-1, out_features});
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) grad_input = grad_2d.mm(weight).view(x.sizes());

    const bool want_weight = ctx->needs_input_grad(1);
    const bool want_bias = bias.defined() && ctx->needs_input_grad(2);
    if (!want_weight && !want_bias) return {grad_input, at::Tensor(), at::Tensor()};

    at::Tensor x_2d = x.reshape({-1, in_features});
    WeightGradStore& store = WeightGradStore::instance();
    // A double backward (create_graph) needs the weight gradient in the graph, so never defer it.
    if (store.defer() && ctx->saved_data.at("deferrable").toBool() && !at::GradMode::is_enabled()) {
      store.stash({x_2d.detach(), grad_2d.detach(), want_weight ? weight : at::Tensor(),
                   want_bias ? bias : at::Tensor()});
      return {grad_input, at::Tensor(), at::Tensor()};
    }
    // A weight with an fp32 main grad accumulates there directly (half weights, fp32 accumulation).
    if (ctx->saved_data.at("deferrable").toBool() && find_main_grad(weight) != nullptr) {
      accumulate_linear_grads(grad_2d, x_2d, want_weight ? weight : at::Tensor(), want_bias ? bias : at::Tensor());
      return {grad_input, at::Tensor(), at::Tensor()};
    }
    return {grad_input, want_weight ? linear_weight_grad(grad_2d, x_2d) : at::Tensor(),
            want_bias ? linear_bias_grad(grad_2d, bias) : at::Tensor()};
  }
};

}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", weight.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.sizes(), " does not end in ",
              weight.size(1), " features");
  const c10::DeviceType device = x.device().type();
  if (at::autocast::is_autocast_enabled(device)) {
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
    return LinearFunction::apply(at::autocast::cached_cast(dtype, x, device),
                                 at::autocast::cached_cast(dtype, weight, device),
                                 at::autocast::cached_cast(dtype, bias, device));
  }
  return LinearFunction::apply(x, weight, bias);
}

}  // namespace hybrid
