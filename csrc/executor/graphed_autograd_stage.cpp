#include "executor/graphed_autograd_stage.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <stdexcept>
#include <utility>

namespace hybrid {

namespace {

// What an I's capture stashes under, taken back at once into its slot: no schedule's stage is negative.
const WgradKey kCaptureKey{-1, 0};

}  // namespace

bool GraphedAutogradStage::Shapes::operator==(const Shapes& o) const {
  return input == o.input && target == o.target && output_grad == o.output_grad && input_dtype == o.input_dtype &&
         target_dtype == o.target_dtype && output_grad_dtype == o.output_grad_dtype && first == o.first &&
         last == o.last && deferred == o.deferred;
}

GraphedAutogradStage::GraphedAutogradStage(std::shared_ptr<AutogradStage> eager, GradBufferPtr grads,
                                           std::vector<at::Tensor> params,
                                           std::shared_ptr<DpParamGather> param_gather, at::Device device,
                                           bool host_rerun)
    : eager_(std::move(eager)),
      grads_(std::move(grads)),
      params_(std::move(params)),
      param_gather_(std::move(param_gather)),
      device_(device),
      graphs_(device, host_rerun) {
  if (!eager_) throw std::invalid_argument("CUDA-graphed stage: needs an autograd stage");
  if (!grads_) throw std::invalid_argument("CUDA-graphed stage: needs the engine's GradBuffer");
  multiplier_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device_));
}

std::string GraphedAutogradStage::describe() const { return eager_->describe() + ", CUDA-graphed"; }

GraphedAutogradStage::Slot& GraphedAutogradStage::free_slot() {
  for (const std::unique_ptr<Slot>& slot : slots_) {
    bool held = false;
    for (const auto& [micro, flight] : in_flight_) held = held || flight.slot == slot.get();
    if (!held) return *slot;
  }
  slots_.push_back(std::make_unique<Slot>());
  slots_.back()->index = static_cast<int>(slots_.size()) - 1;
  return *slots_.back();
}

bool GraphedAutogradStage::matches(const Slot& slot, const at::Tensor& input, const at::Tensor& target,
                                   bool first_stage) const {
  const Shapes& c = slot.captured;
  if (!slot.forward || c.first != first_stage || c.last != target.defined() || c.input != input.sizes().vec() ||
      c.input_dtype != input.scalar_type()) {
    return false;
  }
  return !c.last || (c.target == target.sizes().vec() && c.target_dtype == target.scalar_type());
}

void GraphedAutogradStage::wait_for_parameters() const {
  if (!param_gather_) return;
  for (const at::Tensor& p : params_) param_gather_->wait_for(p);
}

void GraphedAutogradStage::set_multiplier(double multiplier) {
  if (multiplier == multiplier_value_) return;
  // Ordered on the stream before the replays that read it, after those already queued.
  multiplier_.fill_(multiplier);
  multiplier_value_ = multiplier;
}

void GraphedAutogradStage::before_step(StepLoss* loss) {
  loss_ = loss;
  in_flight_.clear();  // a step that failed may have left micro-batches in flight: none is now
  std::vector<Slot*> to_capture;
  for (const std::unique_ptr<Slot>& slot : slots_) {
    const bool capture_now = slot->recorded && !slot->replayed && !(slot->forward && slot->seen == slot->captured) &&
                             (!slot->seen.last || loss != nullptr);
    slot->recorded = slot->replayed = false;
    if (capture_now) to_capture.push_back(slot.get());
  }
  if (to_capture.empty()) return;
  graphs_.release_cached_memory();
  for (Slot* slot : to_capture) capture(*slot);
}

void GraphedAutogradStage::release() {
  in_flight_.clear();
  slot_of_micro_.clear();
  slots_.clear();  // each slot's graphs with their pools, and its static buffers
}

void GraphedAutogradStage::forward(MicroState& s, int micro, const at::Tensor& input, bool first_stage,
                                   StepLoss* loss) {
  if (in_flight_.count(micro) != 0) {
    throw std::runtime_error("CUDA-graphed stage: micro-batch " + std::to_string(micro) + " forwarded twice");
  }
  Slot& slot = free_slot();
  if (slot_of_micro_.size() <= static_cast<size_t>(micro)) slot_of_micro_.resize(micro + 1, -1);
  slot_of_micro_[micro] = slot.index;
  const at::Tensor target = loss != nullptr ? loss->target(micro) : at::Tensor();  // drawn once, here
  if (!matches(slot, input, target, first_stage)) {
    // The warm-up, or shapes the slot's graphs were not captured for: eager, its shapes recorded for a capture.
    if (loss != nullptr) {
      eager_->forward(s, micro, input, first_stage, *loss, target);
    } else {
      eager_->forward(s, micro, input, first_stage, nullptr);
      s.saved = {s.output};  // the backward's root (the executor drops s.output once it is sent)
    }
    in_flight_[micro] = {&slot, true};
    // The step's first eager micro-batch in the slot sets the shapes to capture (a smaller last one does not).
    if (slot.recorded) return;
    slot.seen = Shapes{};
    slot.seen.input = input.sizes().vec();
    slot.seen.input_dtype = input.scalar_type();
    slot.seen.first = first_stage;
    slot.seen.last = loss != nullptr;
    if (loss != nullptr) {
      slot.seen.target = target.sizes().vec();
      slot.seen.target_dtype = target.scalar_type();
    }
    return;
  }
  wait_for_parameters();
  loss_ = loss != nullptr ? loss : loss_;
  {
    at::NoGradGuard no_grad;  // the static input is a leaf that requires a gradient
    slot.input.copy_(input);
    if (loss != nullptr) {
      slot.target.copy_(target);
      set_multiplier(loss->multiplier());
    }
  }
  slot.forward->replay();
  ++replays_;
  slot.replayed = true;
  if (loss != nullptr) {
    loss->record(micro, slot.loss.detach().clone());  // the slot's next replay overwrites the static one
  } else {
    s.output = slot.output.detach().clone();  // a send may still read it when the slot's next micro-batch replays
  }
  in_flight_[micro] = {&slot, false};
}

at::Tensor GraphedAutogradStage::backward(MicroState& s, int micro, const at::Tensor& output_grad, bool first_stage,
                                          StepLoss* loss) {
  auto it = in_flight_.find(micro);
  if (it == in_flight_.end()) {
    throw std::runtime_error("CUDA-graphed stage: backward of micro-batch " + std::to_string(micro) +
                             " with no forward");
  }
  if (it->second.awaiting_w) {
    throw std::runtime_error("CUDA-graphed stage: a second backward of micro-batch " + std::to_string(micro));
  }
  const InFlight flight = it->second;
  // An I's stashes read the slot's buffers until its W (after_weight_grads gives the slot back then).
  const bool deferred = grads_->wgrad().defer();
  if (deferred) {
    it->second.awaiting_w = true;
  } else {
    in_flight_.erase(it);
  }
  Slot& slot = *flight.slot;
  if (flight.eager) {
    if (loss == nullptr) s.output = s.saved.at(0);
    s.saved.clear();
    if (output_grad.defined() && !slot.recorded) {
      slot.seen.output_grad = output_grad.sizes().vec();
      slot.seen.output_grad_dtype = output_grad.scalar_type();
    }
    slot.seen.deferred = slot.seen.deferred || deferred;  // an I graph serves the slot's B too, not the reverse
    slot.recorded = true;
    return eager_->backward(s, micro, output_grad, first_stage, loss);
  }
  const Shapes& c = slot.captured;
  if (deferred && !c.deferred) {
    throw std::runtime_error("CUDA-graphed stage: micro-batch " + std::to_string(micro) +
                             "'s I in a slot whose backward was captured whole (B)");
  }
  if (!c.last && (c.output_grad != output_grad.sizes().vec() || c.output_grad_dtype != output_grad.scalar_type())) {
    throw std::runtime_error("CUDA-graphed stage: micro-batch " + std::to_string(micro) +
                             "'s output gradient is not of the shape and dtype its graphs were captured for");
  }
  if (!c.last) {
    at::NoGradGuard no_grad;
    slot.output_grad.copy_(output_grad);
  }
  slot.backward->replay();
  ++replays_;
  for (const at::Tensor& p : slot.finals) grads_->grad_final(p);
  if (deferred) {
    for (const WgradEntry& e : slot.stash) grads_->wgrad().stash(e);  // under the I's (stage, micro), for its W
    stashed_ += static_cast<int64_t>(slot.stash.size());
  } else if (c.deferred) {
    grads_->flush_entries(slot.stash);  // a whole B replayed as its I: the weight gradients now
  }
  s = MicroState{};
  return first_stage ? at::Tensor() : slot.input_grad.clone();  // a send may still read it at the slot's next B
}

void GraphedAutogradStage::after_weight_grads(int micro) {
  auto it = in_flight_.find(micro);
  if (it != in_flight_.end() && it->second.awaiting_w) in_flight_.erase(it);
}

void GraphedAutogradStage::capture(Slot& slot) {
  const Shapes shapes = slot.seen;
  // What the old graphs wrote goes first, then the graphs and their pools.
  slot.output = slot.loss = slot.root = slot.input_grad = at::Tensor();
  slot.finals.clear();
  slot.stash.clear();
  slot.backward.reset();
  slot.forward.reset();
  slot.captured = shapes;
  const at::TensorOptions on_device = at::TensorOptions().device(device_);
  slot.input = at::empty(shapes.input, on_device.dtype(shapes.input_dtype));
  if (input_collects_grad(shapes.first, shapes.input_dtype)) slot.input.requires_grad_(true);
  slot.target = shapes.last ? at::empty(shapes.target, on_device.dtype(shapes.target_dtype)) : at::Tensor();
  slot.output_grad =
      shapes.last ? at::Tensor() : at::empty(shapes.output_grad, on_device.dtype(shapes.output_grad_dtype));
  {
    // Contents a capture may read while it records (a host rerun computes with them): a defined zero state.
    at::NoGradGuard no_grad;
    slot.input.zero_();
    if (slot.target.defined()) slot.target.zero_();
    if (slot.output_grad.defined()) slot.output_grad.zero_();
  }
  wait_for_parameters();
  std::unique_ptr<StageGraph> forward = graphs_.make();
  forward->capture([this, &slot] {
    at::AutoGradMode grad_mode(true);
    at::Tensor out = eager_->fn()(slot.input);
    if (!slot.target.defined()) {
      slot.output = slot.root = out;
      return;
    }
    if (loss_ == nullptr) throw std::runtime_error("CUDA-graphed stage: the last stage's F needs the step's loss");
    slot.loss = loss_->unrecorded_loss(slot.index, out, slot.target);
    slot.root = slot.loss * multiplier_;
  });
  // The slots' B graphs share one pool: they replay one at a time, and what one keeps (the input gradient) is
  // copied before the next replays; F graphs keep their saved activations until their B, each in a pool of its
  // own. An I keeps its stashes until its W, while other slots replay: it captures into its F's pool.
  std::unique_ptr<StageGraph> backward = shapes.deferred ? graphs_.make_after(*forward) : graphs_.make(true);
  backward->capture([this, &slot] {
    slot.finals.clear();
    {
      std::optional<DeferWeightGrads> defer;
      if (slot.captured.deferred) defer.emplace(grads_->wgrad(), kCaptureKey);
      MutedGradFinal muted(*grads_, &slot.finals);  // made again after each replay
      if (slot.root.requires_grad()) {
        if (slot.target.defined()) {
          torch::autograd::backward({slot.root});
        } else {
          torch::autograd::backward({slot.root}, {slot.output_grad});
        }
      }
    }
    if (slot.captured.deferred) slot.stash = grads_->wgrad().take({kCaptureKey});
    at::Tensor input_grad;
    if (slot.input.requires_grad()) {
      input_grad = slot.input.grad();
      slot.input.mutable_grad().reset();  // the replays write where the capture's gradient lives
    }
    // An input the stage ignores still owes upstream a gradient: zeros keep the channels in step.
    if (!slot.captured.first && !input_grad.defined()) input_grad = at::zeros_like(slot.input);
    slot.input_grad = input_grad;
  });
  slot.forward = std::move(forward);
  slot.backward = std::move(backward);
  captures_ += 2;
}

}  // namespace hybrid
