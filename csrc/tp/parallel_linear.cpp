#include "tp/parallel_linear.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

#include "tp/linear.h"
#include "tp/saved_group.h"
#include "tp/sequence_region.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the backward needs besides tensors: the buffer, the trace and the layer's label, kept in saved_data.
struct LayerContext : torch::CustomClassHolder {
  GradBufferPtr grads;
  std::shared_ptr<CommTrace> trace;
  int64_t layer = 0;
  bool sequence_parallel = false;
  bool deferrable = false;

  void launched(CommKind kind, const c10::intrusive_ptr<c10d::Work>& work) const {
    if (trace && work) trace->launched(kind, static_cast<int>(layer), work, CommAxis::MP);  // none: traced
  }
};
using LayerContextPtr = c10::intrusive_ptr<LayerContext>;

void save_layer(AutogradContext* ctx, const GroupPtr& group, LayerContextPtr layer, const at::Tensor& input,
                const at::Tensor& weight, const at::Tensor& bias) {
  save_group(ctx, group);
  // Leaf parameters are kept by identity, outside the saved-tensor machinery (as hybrid::linear does: a
  // checkpoint's saved-tensor hooks would hand the backward a detached copy whose gradient would be lost).
  layer->deferrable = weight.is_leaf() && (!bias.defined() || bias.is_leaf());
  if (layer->deferrable) {
    ctx->save_for_backward({input});
    ctx->saved_data["weight"] = weight;
    ctx->saved_data["bias"] = bias;
  } else {
    ctx->save_for_backward({input, weight, bias});
  }
  ctx->saved_data["layer"] = c10::IValue::make_capsule(std::move(layer));
}

struct Saved {
  at::Tensor input, weight, bias;
  LayerContextPtr layer;
};

Saved saved_layer(AutogradContext* ctx) {
  variable_list saved = ctx->get_saved_variables();
  auto layer = c10::static_intrusive_pointer_cast<LayerContext>(ctx->saved_data.at("layer").toCapsule());
  if (layer->deferrable) {
    return {saved[0], ctx->saved_data.at("weight").toTensor(), ctx->saved_data.at("bias").toTensor(), layer};
  }
  return {saved[0], saved[1], saved[2], layer};
}

// The sum over MP of a fresh partial result: all-reduced in place, or reduce-scattered along the sequence.
PendingCollective sum_over_mp(const at::Tensor& partial, const GroupPtr& group, const LayerContext& layer) {
  if (layer.sequence_parallel) {
    PendingCollective pending = reduce_scatter_seq_async(partial, group);
    layer.launched(has_reduce_scatter(group) ? CommKind::ReduceScatter : CommKind::AllReduce, pending.work);
    return pending;
  }
  at::Tensor total = partial;
  auto work = all_reduce_sum_async(total, group);
  layer.launched(CommKind::AllReduce, work);
  return {work, [total] { return total; }};
}

at::Tensor gather_sequence(const at::Tensor& x, const GroupPtr& group, const LayerContext& layer) {
  PendingCollective pending = all_gather_seq_async(x, group);
  layer.launched(CommKind::AllGather, pending.work);
  return pending.wait();
}

struct ColumnParallelLinear : public torch::autograd::Function<ColumnParallelLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, const GroupPtr& group, LayerContextPtr layer) {
    const at::Tensor total = layer->sequence_parallel ? gather_sequence(x, group, *layer) : x;
    const at::Tensor b = bias.value_or(at::Tensor());
    save_layer(ctx, group, layer, total, weight, b);
    return at::linear(total, weight, bias);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none, none, none};
    const Saved s = saved_layer(ctx);
    const GroupPtr group = saved_group(ctx);
    const at::Tensor grad_2d = grads[0].reshape({-1, s.weight.size(0)});
    PendingCollective input_grad;
    if (ctx->needs_input_grad(0)) {
      input_grad = sum_over_mp(grad_2d.mm(s.weight).view(s.input.sizes()), group, *s.layer);
    }
    // Under the collective just started: the weight gradient's GEMM.
    const bool want_weight = ctx->needs_input_grad(1);
    const bool want_bias = s.bias.defined() && ctx->needs_input_grad(2);
    LinearParamGrads params;
    if (want_weight || want_bias) {
      params = linear_param_grads(grad_2d, s.input.reshape({-1, s.weight.size(1)}), s.weight, s.bias, want_weight,
                                  want_bias, s.layer->grads, s.layer->deferrable);
    }
    return {input_grad.result ? input_grad.wait() : none, params.weight, params.bias, none, none};
  }
};

struct RowParallelLinear : public torch::autograd::Function<RowParallelLinear> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const GroupPtr& group, LayerContextPtr layer) {
    save_layer(ctx, group, layer, x, weight, at::Tensor());
    return sum_over_mp(at::linear(x, weight), group, *layer).wait();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor none;
    if (!grads[0].defined()) return {none, none, none, none};
    const Saved s = saved_layer(ctx);
    const at::Tensor grad = s.layer->sequence_parallel ? gather_sequence(grads[0], saved_group(ctx), *s.layer)
                                                       : grads[0];
    const at::Tensor grad_2d = grad.reshape({-1, s.weight.size(0)});
    at::Tensor input_grad;
    if (ctx->needs_input_grad(0)) input_grad = grad_2d.mm(s.weight).view(s.input.sizes());
    LinearParamGrads params;
    if (ctx->needs_input_grad(1)) {
      params = linear_param_grads(grad_2d, s.input.reshape({-1, s.weight.size(1)}), s.weight, at::Tensor(), true,
                                  false, s.layer->grads, s.layer->deferrable);
    }
    return {input_grad, params.weight, none, none};
  }
};

LayerContextPtr layer_context(const GradBufferPtr& grads, const std::shared_ptr<CommTrace>& trace, int64_t layer,
                              bool sequence_parallel) {
  auto context = c10::make_intrusive<LayerContext>();
  context->grads = grads;
  context->trace = trace;
  context->layer = layer;
  context->sequence_parallel = sequence_parallel;
  return context;
}

// Under autocast the operands are cast first (through autocast's weight cache), as hybrid::linear does.
at::Tensor autocast_operand(const at::Tensor& t, const at::Tensor& like) {
  const c10::DeviceType device = like.device().type();
  if (!t.defined() || !at::autocast::is_autocast_enabled(device)) return t;
  return at::autocast::cached_cast(at::autocast::get_autocast_dtype(device), t, device);
}

}  // namespace

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  const GradBufferPtr& grads, const GroupPtr& group, bool sequence_parallel,
                                  const std::shared_ptr<CommTrace>& trace, int64_t layer) {
  if (is_trivial(group)) return linear(x, weight, bias, grads);
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "column_parallel_linear: input ", x.sizes(),
              " does not end in ", weight.size(1), " features");
  std::optional<at::Tensor> b;
  if (bias.has_value()) b = autocast_operand(*bias, x);
  return ColumnParallelLinear::apply(autocast_operand(x, x), autocast_operand(weight, x), b, group,
                                     layer_context(grads, trace, layer, sequence_parallel));
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const GradBufferPtr& grads,
                               const GroupPtr& group, bool sequence_parallel,
                               const std::shared_ptr<CommTrace>& trace, int64_t layer) {
  if (is_trivial(group)) return linear(x, weight, std::nullopt, grads);
  TORCH_CHECK(weight.dim() == 2 && x.size(-1) == weight.size(1), "row_parallel_linear: input ", x.sizes(),
              " does not end in ", weight.size(1), " features");
  return RowParallelLinear::apply(autocast_operand(x, x), autocast_operand(weight, x), group,
                                  layer_context(grads, trace, layer, sequence_parallel));
}

}  // namespace hybrid
