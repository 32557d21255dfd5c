#include "executor/graphed_stage.h"

#include <c10/core/GradMode.h>

#include <stdexcept>
#include <utility>

#include "executor/mse_loss.h"

namespace hybrid {

namespace {

at::Tensor flat_rows(const at::Tensor& t) { return t.dim() == 2 ? t : t.reshape({-1, t.size(-1)}); }

bool is_same_param(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.unsafeGetTensorImpl() == b.unsafeGetTensorImpl();
}

}  // namespace

GraphedChainStage::GraphedChainStage(std::shared_ptr<NativeChainStage> eager, at::Device device, bool host_rerun)
    : eager_(std::move(eager)), device_(device), host_rerun_(host_rerun) {
  if (!eager_) throw std::invalid_argument("CUDA-graphed stage: needs a native chain stage");
  if (eager_->recompute()) {
    throw std::invalid_argument("CUDA-graphed stage: a recomputed stage is not graphed (its backward reruns the "
                                "forward)");
  }
  make_stage_graph(device_, host_rerun_);  // a device or build without CUDA graphs fails here, not mid-step
  multiplier_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  // The eager backward walks the layers back and announces a parameter after the lowest layer it appears in.
  const std::vector<ChainLayer>& layers = eager_->chain().layers();
  for (size_t k = layers.size(); k-- > 0;) {
    for (const at::Tensor& p : {layers[k].weight, layers[k].bias}) {
      if (!p.defined() || !p.requires_grad()) continue;
      bool lower = false;
      for (size_t i = 0; i < k && !lower; ++i) lower = is_same_param(layers[i].weight, p) || is_same_param(layers[i].bias, p);
      bool listed = false;
      for (const at::Tensor& q : final_order_) listed = listed || is_same_param(q, p);
      if (!lower && !listed) final_order_.push_back(p);
    }
  }
}

std::string GraphedChainStage::describe() const { return eager_->describe() + ", CUDA-graphed"; }

void GraphedChainStage::wait_for_parameters() const {
  const std::shared_ptr<DpParamGather>& gather = eager_->param_gather();
  if (!gather) return;
  for (const ChainLayer& layer : eager_->chain().layers()) {
    gather->wait_for(layer.weight);
    if (layer.bias.defined()) gather->wait_for(layer.bias);
  }
}

void GraphedChainStage::set_multiplier(double multiplier) {
  if (multiplier == multiplier_value_) return;
  // Ordered on the stream before the replays that read it, after those already queued.
  multiplier_.fill_(multiplier);
  multiplier_value_ = multiplier;
}

void GraphedChainStage::announce_final() const {
  GradBuffer& grads = *eager_->grads();
  for (const at::Tensor& p : final_order_) grads.grad_final(p);
}

void GraphedChainStage::forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage,
                                StepLoss* loss) {
  Slot& slot = slots_[micro];
  if (!slot.warmed) {
    eager_->forward(s, micro, input, first_stage, loss);
    slot.eager_in_flight = true;
    return;
  }
  at::NoGradGuard no_grad;
  at::Tensor target;
  if (loss != nullptr) {
    if (!loss->spec().builtin_mse) {
      throw std::runtime_error("CUDA-graphed stage: the last stage's loss must be the built-in MSE");
    }
    target = loss->target(micro);
  }
  wait_for_parameters();
  if (!slot.forward || slot.input_sizes != input.sizes().vec() || slot.input_dtype != input.scalar_type() ||
      (target.defined() && (slot.target_sizes != target.sizes().vec() ||
                            slot.target.scalar_type() != target.scalar_type()))) {
    capture_forward(slot, input, target);
  }
  slot.input.copy_(input);
  if (target.defined()) {
    slot.target.copy_(target);
    set_multiplier(loss->multiplier());
  }
  slot.forward->replay();
  ++replays_;
  if (target.defined()) {
    loss->record(micro, slot.loss.clone());  // the next step's replay overwrites the static one
  } else {
    s.output = slot.output;
  }
}

void GraphedChainStage::capture_forward(Slot& slot, const at::Tensor& input, const at::Tensor& target) {
  // A new capture replaces the activations the old backward graph reads: both go, and their pools with them.
  slot.backward.reset();
  slot.forward.reset();
  slot.saved.clear();
  slot.output = slot.loss = slot.output_grad = slot.input_grad = at::Tensor();
  slot.input_sizes = input.sizes().vec();
  slot.input_dtype = input.scalar_type();
  slot.input = at::empty_like(input, at::MemoryFormat::Contiguous);
  slot.target = target.defined() ? at::empty_like(target, at::MemoryFormat::Contiguous) : at::Tensor();
  slot.target_sizes = target.defined() ? target.sizes().vec() : std::vector<int64_t>{};
  std::unique_ptr<StageGraph> graph = make_stage_graph(device_, host_rerun_);
  graph->capture([this, &slot] {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    at::Tensor out = eager_->chain().forward(flat_rows(slot.input), /*recompute=*/false, saved);
    if (slot.input.dim() != 2) {
      std::vector<int64_t> sizes(slot.input_sizes.begin(), slot.input_sizes.end() - 1);
      sizes.push_back(out.size(-1));
      out = out.view(sizes);
    }
    slot.saved = std::move(saved);
    if (!slot.target.defined()) {
      slot.output = out;
      return;
    }
    if (out.sizes() != slot.target.sizes()) {
      throw std::runtime_error("CUDA-graphed stage: the target's shape " + c10::str(slot.target.sizes()) +
                               " is not the output's " + c10::str(out.sizes()) +
                               " (the graphed MSE takes equal shapes; use --cuda-graphs off)");
    }
    LossAndGrad loss = mse_loss_and_grad(out, slot.target, multiplier_);
    slot.loss = loss.loss;
    slot.output_grad = loss.grad;
  });
  slot.forward = std::move(graph);
  ++captures_;
}

at::Tensor GraphedChainStage::backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                                       StepLoss* loss) {
  auto it = slots_.find(micro);
  if (it == slots_.end()) throw std::runtime_error("CUDA-graphed stage: backward of a micro-batch with no forward");
  Slot& slot = it->second;
  if (slot.eager_in_flight) {
    at::Tensor input_grad = eager_->backward(s, micro, output_grad, first_stage, loss);
    slot.eager_in_flight = false;
    slot.warmed = true;
    return input_grad;
  }
  GradBuffer& grads = *eager_->grads();
  if (grads.wgrad().defer()) {
    throw std::runtime_error("CUDA-graphed stage: deferred weight gradients (zero-bubble I and W) are not graphed");
  }
  at::NoGradGuard no_grad;
  const bool last = loss != nullptr;
  const bool want_input_grad = !first_stage;
  const bool overwrite = grads.overwrites();
  if (!slot.backward || slot.want_input_grad != want_input_grad || slot.overwrite != overwrite ||
      (!last && slot.output_grad.sizes() != output_grad.sizes())) {
    capture_backward(slot, last ? at::Tensor() : output_grad, want_input_grad, overwrite);
  }
  if (!last) slot.output_grad.copy_(output_grad);
  slot.backward->replay();
  ++replays_;
  announce_final();
  s = MicroState{};
  return want_input_grad ? slot.input_grad : at::Tensor();
}

void GraphedChainStage::capture_backward(Slot& slot, const at::Tensor& output_grad, bool want_input_grad,
                                         bool overwrite) {
  slot.backward.reset();
  slot.input_grad = at::Tensor();
  if (output_grad.defined()) slot.output_grad = at::empty_like(output_grad, at::MemoryFormat::Contiguous);
  slot.want_input_grad = want_input_grad;
  slot.overwrite = overwrite;
  std::unique_ptr<StageGraph> graph = make_stage_graph(device_, host_rerun_);
  graph->capture([this, &slot, want_input_grad] {
    at::NoGradGuard no_grad;
    GradBuffer& grads = *eager_->grads();
    MutedGradFinal muted(grads);  // announced after each replay (announce_final)
    at::Tensor input_grad = eager_->chain().backward(flat_rows(slot.output_grad), slot.saved, /*recompute=*/false,
                                                     want_input_grad, grads);
    if (input_grad.defined() && slot.input.dim() != 2) input_grad = input_grad.view(slot.input_sizes);
    slot.input_grad = input_grad;
  });
  slot.backward = std::move(graph);
  ++captures_;
}

}  // namespace hybrid
