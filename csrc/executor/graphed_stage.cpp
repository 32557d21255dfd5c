#include "executor/graphed_stage.h"

#include <c10/core/GradMode.h>

#include <optional>
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

bool GraphedChainStage::Shapes::operator==(const Shapes& o) const {
  return input == o.input && target == o.target && output_grad == o.output_grad && input_dtype == o.input_dtype &&
         target_dtype == o.target_dtype && output_grad_dtype == o.output_grad_dtype && last == o.last &&
         want_input_grad == o.want_input_grad && overwrite == o.overwrite;
}

GraphedChainStage::GraphedChainStage(std::shared_ptr<NativeChainStage> eager, at::Device device, bool host_rerun)
    : eager_(std::move(eager)), device_(device), graphs_(device, host_rerun) {
  if (!eager_) throw std::invalid_argument("CUDA-graphed stage: needs a native chain stage");
  if (eager_->recompute()) {
    throw std::invalid_argument("CUDA-graphed stage: a recomputed stage is not graphed (its backward reruns the "
                                "forward)");
  }
  multiplier_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
  // The eager backward walks the layers back and announces a parameter after the lowest layer it appears in.
  const std::vector<ChainLayer>& layers = eager_->chain().layers();
  for (size_t k = layers.size(); k-- > 0;) {
    for (const at::Tensor& p : {layers[k].weight, layers[k].bias}) {
      if (!p.defined() || !p.requires_grad()) continue;
      bool lower = false;
      for (size_t i = 0; i < k && !lower; ++i) {
        lower = is_same_param(layers[i].weight, p) || is_same_param(layers[i].bias, p);
      }
      bool listed = false;
      for (const at::Tensor& q : final_order_) listed = listed || is_same_param(q, p);
      if (!lower && !listed) final_order_.push_back(p);
    }
  }
}

std::string GraphedChainStage::describe() const { return eager_->describe() + ", CUDA-graphed"; }

int64_t GraphedChainStage::output_features() const {
  const ChainLayer& last = eager_->chain().layers().back();
  return last.weight.size(0) * (last.kind == LayerKind::ColumnGather ? eager_->chain().mp_size() : 1);
}

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

bool GraphedChainStage::matches(const Slot& slot, const at::Tensor& input, const at::Tensor& target) const {
  const Shapes& c = slot.captured;
  if (!slot.forward || c.last != target.defined() || c.input != input.sizes().vec() ||
      c.input_dtype != input.scalar_type()) {
    return false;
  }
  return !c.last || (c.target == target.sizes().vec() && c.target_dtype == target.scalar_type());
}

void GraphedChainStage::before_step(StepLoss* /*loss*/) {
  for (auto& [micro, slot] : slots_) {
    if (!slot.recorded) continue;
    slot.recorded = false;
    if (slot.graphable && !(slot.forward && slot.seen == slot.captured)) capture(slot);
  }
}

void GraphedChainStage::release() { slots_.clear(); }  // each micro-batch index's graphs, pools and buffers

void GraphedChainStage::forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage,
                                StepLoss* loss) {
  Slot& slot = slots_[micro];
  const at::Tensor target = loss != nullptr ? loss->target(micro) : at::Tensor();  // drawn once, here
  if (!matches(slot, input, target)) {
    // The warm-up, or shapes the graphs were not captured for: eager, its shapes recorded for the next capture.
    if (loss != nullptr) {
      eager_->forward(s, micro, input, *loss, target);
    } else {
      eager_->forward(s, micro, input, first_stage, nullptr);
    }
    slot.eager_in_flight = true;
    slot.seen = Shapes{};
    slot.seen.input = input.sizes().vec();
    slot.seen.input_dtype = input.scalar_type();
    slot.seen.last = loss != nullptr;
    slot.graphable = true;
    if (loss != nullptr) {
      slot.seen.target = target.sizes().vec();
      slot.seen.target_dtype = target.scalar_type();
      std::vector<int64_t> output(slot.seen.input.begin(), slot.seen.input.end() - 1);
      output.push_back(output_features());
      slot.graphable = loss->spec().builtin_mse && output == slot.seen.target;
    }
    return;
  }
  at::NoGradGuard no_grad;
  wait_for_parameters();
  slot.input.copy_(input);
  if (loss != nullptr) {
    slot.target.copy_(target);
    set_multiplier(loss->multiplier());
  }
  slot.forward->replay();
  ++replays_;
  if (loss != nullptr) {
    loss->record(micro, slot.loss.clone());  // the next step's replay overwrites the static one
  } else {
    s.output = slot.output;
  }
}

at::Tensor GraphedChainStage::backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                                       StepLoss* loss) {
  auto it = slots_.find(micro);
  if (it == slots_.end()) throw std::runtime_error("CUDA-graphed stage: backward of a micro-batch with no forward");
  Slot& slot = it->second;
  GradBuffer& grads = *eager_->grads();
  const bool want_input_grad = !first_stage;
  if (slot.eager_in_flight) {
    slot.seen.want_input_grad = want_input_grad;
    slot.seen.overwrite = grads.overwrites();
    if (output_grad.defined()) {
      slot.seen.output_grad = output_grad.sizes().vec();
      slot.seen.output_grad_dtype = output_grad.scalar_type();
    }
    at::Tensor input_grad = eager_->backward(s, micro, output_grad, first_stage, loss);
    slot.eager_in_flight = false;
    slot.recorded = true;
    return input_grad;
  }
  if (grads.wgrad().defer()) {
    throw std::runtime_error("CUDA-graphed stage: deferred weight gradients (zero-bubble I and W) are not graphed");
  }
  at::NoGradGuard no_grad;
  const Shapes& c = slot.captured;
  at::Tensor input_grad;
  if (c.want_input_grad != want_input_grad || c.overwrite != grads.overwrites() ||
      (!c.last && (c.output_grad != output_grad.sizes().vec() || c.output_grad_dtype != output_grad.scalar_type()))) {
    // A backward the graph was not captured for: the eager chain's, from the forward graph's activations.
    slot.seen = c;
    slot.seen.want_input_grad = want_input_grad;
    slot.seen.overwrite = grads.overwrites();
    if (!c.last) {
      slot.seen.output_grad = output_grad.sizes().vec();
      slot.seen.output_grad_dtype = output_grad.scalar_type();
    }
    slot.recorded = true;
    input_grad = eager_->chain().backward(flat_rows(c.last ? slot.output_grad : output_grad), slot.saved,
                                          /*recompute=*/false, want_input_grad, grads);
    if (input_grad.defined() && slot.input.dim() != 2) input_grad = input_grad.view(c.input);
  } else {
    if (!c.last) slot.output_grad.copy_(output_grad);
    slot.backward->replay();
    ++replays_;
    announce_final();
    input_grad = slot.input_grad;
  }
  s = MicroState{};
  return want_input_grad ? input_grad : at::Tensor();
}

void GraphedChainStage::capture(Slot& slot) {
  const Shapes shapes = slot.seen;
  // What the old graphs wrote goes first, then the graphs and their pools.
  slot.saved.clear();
  slot.output = slot.loss = slot.input_grad = slot.output_grad = at::Tensor();
  slot.backward.reset();
  slot.forward.reset();
  slot.captured = shapes;  // the bodies read it (a CUDA graph's capture runs them)
  const at::TensorOptions on_device = at::TensorOptions().device(device_);
  slot.input = at::empty(shapes.input, on_device.dtype(shapes.input_dtype));
  slot.target = shapes.last ? at::empty(shapes.target, on_device.dtype(shapes.target_dtype)) : at::Tensor();
  slot.output_grad =
      shapes.last ? at::Tensor() : at::empty(shapes.output_grad, on_device.dtype(shapes.output_grad_dtype));
  std::unique_ptr<StageGraph> forward = graphs_.make();
  forward->capture([this, &slot] {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> saved;
    at::Tensor out = eager_->chain().forward(flat_rows(slot.input), /*recompute=*/false, saved);
    if (slot.input.dim() != 2) {
      std::vector<int64_t> sizes(slot.captured.input.begin(), slot.captured.input.end() - 1);
      sizes.push_back(out.size(-1));
      out = out.view(sizes);
    }
    slot.saved = std::move(saved);
    if (!slot.target.defined()) {
      slot.output = out;
      return;
    }
    LossAndGrad loss = mse_loss_and_grad(out, slot.target, multiplier_);
    slot.loss = loss.loss;
    slot.output_grad = loss.grad;
  });
  std::unique_ptr<StageGraph> backward = graphs_.make();
  backward->capture([this, &slot] {
    at::NoGradGuard no_grad;
    GradBuffer& grads = *eager_->grads();
    MutedGradFinal muted(grads);  // announced after each replay (announce_final)
    // Written, not added to, where the eager backward was the step's only write (one micro-batch, no W).
    std::optional<OverwriteWeightGrads> overwrite;
    if (slot.captured.overwrite && !grads.overwrites()) overwrite.emplace(grads);
    at::Tensor input_grad = eager_->chain().backward(flat_rows(slot.output_grad), slot.saved, /*recompute=*/false,
                                                     slot.captured.want_input_grad, grads);
    if (input_grad.defined() && slot.input.dim() != 2) input_grad = input_grad.view(slot.captured.input);
    slot.input_grad = input_grad;
  });
  slot.forward = std::move(forward);
  slot.backward = std::move(backward);
  captures_ += 2;
}

}  // namespace hybrid
