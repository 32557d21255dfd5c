#include "tp/linear.h"

#include <ATen/autocast_mode.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "grad/accumulate.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct LinearFunction : public torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const GradBufferPtr& grads) {
    at::Tensor b = bias.has_value() ? *bias : at::Tensor();
    // Leaf-ness is a property of the caller's graph, visible only here.
    const bool deferrable = weight.is_leaf() && (!b.defined() || b.is_leaf());
    ctx->saved_data["deferrable"] = deferrable;
    if (deferrable) {
      // Leaf parameters are kept by identity, outside the saved-tensor machinery: a saved-tensor hook (torch's
      // non-reentrant checkpoint recomputation) would hand the backward a detached copy, and the gradient written
      // into that copy's .grad, or looked up in the GradBuffer by it, would be lost.
      ctx->save_for_backward({x});
      ctx->saved_data["weight"] = weight;
      ctx->saved_data["bias"] = b;
    } else {
      ctx->save_for_backward({x, weight, b});
    }
    if (grads) ctx->saved_data["grads"] = c10::IValue::make_capsule(grads);
    return at::linear(x, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const bool deferrable = ctx->saved_data.at("deferrable").toBool();
    const at::Tensor& x = saved[0];
    const at::Tensor weight = deferrable ? ctx->saved_data.at("weight").toTensor() : saved[1];
    const at::Tensor bias = deferrable ? ctx->saved_data.at("bias").toTensor() : saved[2];
    const at::Tensor& grad = grads[0];
    if (!grad.defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};

    const int64_t out_features = weight.size(0);
    const int64_t in_features = weight.size(1);
    at::Tensor grad_2d = grad.reshape({-1, out_features});
    at::Tensor grad_input;
    if (ctx->needs_input_grad(0)) grad_input = grad_2d.mm(weight).view(x.sizes());

    const bool want_weight = ctx->needs_input_grad(1);
    const bool want_bias = bias.defined() && ctx->needs_input_grad(2);
    if (!want_weight && !want_bias) return {grad_input, at::Tensor(), at::Tensor(), at::Tensor()};
    auto found = ctx->saved_data.find("grads");
    const GradBufferPtr buffer = found != ctx->saved_data.end()
                                     ? c10::static_intrusive_pointer_cast<GradBuffer>(found->second.toCapsule())
                                     : GradBufferPtr();
    LinearParamGrads params = linear_param_grads(grad_2d, x.reshape({-1, in_features}), weight, bias, want_weight,
                                                 want_bias, buffer, deferrable);
    return {grad_input, params.weight, params.bias, at::Tensor()};
  }
};

}  // namespace

LinearParamGrads linear_param_grads(const at::Tensor& grad_2d, const at::Tensor& x_2d, const at::Tensor& weight,
                                    const at::Tensor& bias, bool want_weight, bool want_bias,
                                    const GradBufferPtr& grads, bool deferrable) {
  const at::Tensor none;
  if (grads && deferrable) {
    const at::Tensor w = want_weight ? weight : none;
    const at::Tensor b = want_bias ? bias : none;
    // A double backward (create_graph) needs the weight gradient in the graph, so never defer it.
    if (grads->wgrad().defer() && !at::GradMode::is_enabled()) {
      grads->wgrad().stash({x_2d.detach(), grad_2d.detach(), w, b});
      return {};
    }
    // A weight with an fp32 main grad accumulates there directly (half weights, fp32 accumulation).
    if (grads->has_main_grad(weight)) {
      grads->accumulate_linear_grads(grad_2d, x_2d, w, b);
      // One backward writes a weight once: in a stage's last gradient action that write is final, and the DP
      // sync (listening only then) may start reducing the bucket while earlier layers' backward goes on.
      grads->grad_final(w);
      grads->grad_final(b);
      return {};
    }
  }
  return {want_weight ? linear_weight_grad(grad_2d, x_2d) : none, want_bias ? linear_bias_grad(grad_2d, bias) : none};
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  const GradBufferPtr& grads) {
  TORCH_CHECK(weight.dim() == 2, "linear: weight must be [out, in], got ", weight.sizes());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear: input ", x.sizes(), " does not end in ",
              weight.size(1), " features");
  const c10::DeviceType device = x.device().type();
  if (at::autocast::is_autocast_enabled(device)) {
    const at::ScalarType dtype = at::autocast::get_autocast_dtype(device);
    return LinearFunction::apply(at::autocast::cached_cast(dtype, x, device),
                                 at::autocast::cached_cast(dtype, weight, device),
                                 at::autocast::cached_cast(dtype, bias, device), grads);
  }
  return LinearFunction::apply(x, weight, bias, grads);
}

}  // namespace hybrid
