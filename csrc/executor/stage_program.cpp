#include "executor/stage_program.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <stdexcept>


namespace hybrid {

namespace {

// A native chain multiplies rows: an input of more dims is flattened to [rows, features] and its output
// unflattened back to the input's leading dims.
at::Tensor as_rows(const at::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

}  // namespace

NativeChainStage::NativeChainStage(LinearChain chain, bool recompute, GradBufferPtr grads,
                                   std::shared_ptr<DpParamGather> param_gather)
    : chain_(std::move(chain)),
      recompute_(recompute),
      grads_(std::move(grads)),
      param_gather_(std::move(param_gather)) {
  if (!grads_) throw std::invalid_argument("native chain: needs the engine's GradBuffer");
}

std::string NativeChainStage::describe() const {
  return "native " + chain_.describe() + (recompute_ ? ", recomputed" : "");
}

at::Tensor NativeChainStage::run_forward(const at::Tensor& rows, bool recompute, std::vector<at::Tensor>& saved,
                                         const std::vector<int64_t>& input_sizes) const {
  std::function<void(size_t)> before_layer;
  if (param_gather_) {
    before_layer = [this](size_t i) {
      const ChainLayer& layer = chain_.layers()[i];
      param_gather_->wait_for(layer.weight);
      if (layer.bias.defined()) param_gather_->wait_for(layer.bias);  // the same bucket (whole layers); a no-op then
    };
  }
  at::Tensor out = chain_.forward(rows, recompute, saved, before_layer);
  if (input_sizes.empty()) return out;
  std::vector<int64_t> sizes(input_sizes.begin(), input_sizes.end() - 1);
  sizes.push_back(out.size(-1));
  return out.view(sizes);
}

void NativeChainStage::forward(MicroState& s, int micro, const at::Tensor& input, bool /*first_stage*/,
                               StepLoss* loss) {
  forward_drawn(s, micro, input, loss, at::Tensor());
}

void NativeChainStage::forward(MicroState& s, int micro, const at::Tensor& input, StepLoss& loss,
                               const at::Tensor& target) {
  // A recomputed last stage draws its target in the backward, where its forward runs.
  if (recompute_) throw std::invalid_argument("native chain: a recomputed stage draws its own target");
  forward_drawn(s, micro, input, &loss, target);
}

void NativeChainStage::forward_drawn(MicroState& s, int micro, const at::Tensor& input, StepLoss* loss,
                                     const at::Tensor& target) {
  at::NoGradGuard no_grad;
  if (input.dim() != 2) s.input_sizes = input.sizes().vec();
  const at::Tensor rows = as_rows(input);
  if (loss != nullptr && recompute_) {
    // The backward reruns this forward anyway, and nothing downstream waits for the output: the whole forward,
    // the loss and the target's draw move there, and only the input waits for it (no output gradient kept).
    s.saved = {rows};
    s.forward_deferred = true;
    return;
  }
  at::Tensor output = run_forward(rows, recompute_, s.saved, s.input_sizes);
  if (loss == nullptr) {
    s.output = output;
  } else {
    s.output_grad = target.defined() ? loss->loss_grad(micro, output, target) : loss->loss_grad(micro, output);
  }
}

at::Tensor NativeChainStage::backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                                      StepLoss* loss) {
  bool recompute = recompute_;
  at::Tensor grad;
  if (loss == nullptr) {
    grad = output_grad;
  } else if (s.forward_deferred) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    at::Tensor output = run_forward(s.saved.at(0), /*recompute=*/false, saved, s.input_sizes);
    grad = loss->loss_grad(micro, output);
    s.saved = std::move(saved);
    recompute = false;  // the activations were just computed
  } else {
    grad = std::move(s.output_grad);
  }
  at::Tensor input_grad = chain_.backward(as_rows(grad), std::move(s.saved), recompute,
                                          /*want_input_grad=*/!first_stage, *grads_);
  if (input_grad.defined() && !s.input_sizes.empty()) input_grad = input_grad.view(s.input_sizes);
  s = MicroState{};
  return input_grad;
}

void AutogradStage::forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss* loss) {
  // A received activation becomes a fresh leaf: the backward leaves the gradient for upstream in its .grad.
  s.input = input_collects_grad(first_stage, input.scalar_type()) ? input.requires_grad_(true) : input;
  at::Tensor output = fn_(s.input);
  if (loss == nullptr) {
    s.output = output;
  } else {
    s.loss = loss->scaled_loss(micro, output);
  }
}

void AutogradStage::forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage, StepLoss& loss,
                            const at::Tensor& target) {
  s.input = input_collects_grad(first_stage, input.scalar_type()) ? input.requires_grad_(true) : input;
  s.loss = loss.scaled_loss(micro, fn_(s.input), target);
}

at::Tensor AutogradStage::backward(MicroState& s, int /*micro*/, const at::Tensor& output_grad, bool first_stage,
                                   StepLoss* loss) {
  const at::Tensor root = loss != nullptr ? s.loss : s.output;
  if (root.requires_grad()) {
    if (output_grad.defined()) {
      torch::autograd::backward({root}, {output_grad});
    } else {
      torch::autograd::backward({root});
    }
  }
  at::Tensor input_grad;
  if (!first_stage) {
    input_grad = s.input.grad();
    // An input the stage ignores still owes upstream a gradient: zeros keep the channels in step.
    if (!input_grad.defined()) input_grad = at::zeros_like(s.input);
  }
  s = MicroState{};
  return input_grad;
}

}  // namespace hybrid
