#include "executor/pipeline_executor.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <sstream>
#include <stdexcept>
#include <tuple>


namespace hybrid {

namespace {

bool is_backward_type(ActionType t) { return t == ActionType::B || t == ActionType::I || t == ActionType::W; }

// Scope of a stage's last gradient action: every gradient write in it is the step's last for that parameter,
// so the C++ paths that announce final gradients (GradBuffer::grad_final) feed the DP sync, which launches a
// bucket's collective as soon as all of it is announced. Disarmed on exit, also when the action throws.
class ArmedGradSync {
 public:
  ArmedGradSync(GradBuffer& grads, std::shared_ptr<DpGradSync> sync, const std::vector<int>& buckets)
      : grads_(grads), sync_(std::move(sync)) {
    sync_->arm(buckets);
    grads_.set_grad_final_listener([sync = sync_](const at::Tensor& grad) { sync->notify(grad); });
  }
  ~ArmedGradSync() {
    grads_.set_grad_final_listener({});
    sync_->disarm();
  }
  ArmedGradSync(const ArmedGradSync&) = delete;
  ArmedGradSync& operator=(const ArmedGradSync&) = delete;

 private:
  GradBuffer& grads_;
  std::shared_ptr<DpGradSync> sync_;
};

}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<Action> actions, ExecutorConfig config,
                                   std::map<int, std::shared_ptr<StageProgram>> programs, LossSpec loss,
                                   std::map<ChannelKey, Channel> send_channels,
                                   std::map<ChannelKey, Channel> recv_channels,
                                   std::vector<TensorSpec> stage_input_specs,
                                   std::vector<TensorSpec> stage_output_specs, at::Device device, GradBufferPtr grads,
                                   std::shared_ptr<DpGradSync> dp_sync, std::map<int, std::vector<int>> stage_buckets,
                                   std::shared_ptr<CommTrace> comm_trace)
    : actions_(std::move(actions)),
      config_(config),
      placement_(config.pp_size, config.num_stages, config.placement),
      programs_(std::move(programs)),
      loss_(std::move(loss)),
      send_channels_(std::move(send_channels)),
      recv_channels_(std::move(recv_channels)),
      input_specs_(std::move(stage_input_specs)),
      output_specs_(std::move(stage_output_specs)),
      device_(device),
      grads_(std::move(grads)),
      dp_sync_(std::move(dp_sync)),
      stage_buckets_(std::move(stage_buckets)),
      comm_trace_(std::move(comm_trace)) {
  if (!grads_) throw std::invalid_argument("executor needs the engine's GradBuffer");
  if (!loss_.builtin_mse && !loss_.fn) throw std::invalid_argument("executor needs a loss");
  if (static_cast<int>(input_specs_.size()) != config_.num_stages ||
      static_cast<int>(output_specs_.size()) != config_.num_stages) {
    throw std::invalid_argument("executor needs one input and one output spec per stage (" +
                                std::to_string(config_.num_stages) + ")");
  }
  bool has_w = false;
  for (size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    if (a.stage < 0 || a.stage >= config_.num_stages) {
      throw std::invalid_argument(where(a) + ": stage outside 0.." + std::to_string(config_.num_stages - 1));
    }
    if (placement_.rank_of(a.stage) != config_.pp_rank) {
      throw std::invalid_argument(where(a) + ": stage is owned by pipeline rank " +
                                  std::to_string(placement_.rank_of(a.stage)));
    }
    if (is_backward_type(a.type)) last_grad_action_[a.stage] = i;
    if (a.type == ActionType::W) {
      has_w = true;
      last_w_micro_[a.stage] = a.micro;
    }
  }
  for (int stage = 0; stage < config_.num_stages; ++stage) {
    const bool mine = placement_.rank_of(stage) == config_.pp_rank;
    auto it = programs_.find(stage);
    if (mine && (it == programs_.end() || !it->second)) {
      throw std::invalid_argument("no stage program for stage " + std::to_string(stage) + " of pipeline rank " +
                                  std::to_string(config_.pp_rank));
    }
    if (!mine && it != programs_.end()) {
      throw std::invalid_argument("stage program for stage " + std::to_string(stage) +
                                  ", which is not a stage of pipeline rank " + std::to_string(config_.pp_rank));
    }
  }
  // Without W actions, I computes everything (there is nothing to defer to).
  if (!has_w) config_.merge_weight_grads = false;
  // A gradient is written once per step in the merged W, or (no W at all) in a single micro-batch's B.
  overwrite_in_backward_ = config_.overwrite_weight_grads && !has_w && config_.num_micro == 1;
  if (!config_.merge_weight_grads && !overwrite_in_backward_) config_.overwrite_weight_grads = false;
}

std::string PipelineExecutor::where(const Action& a) const {
  return "pipeline rank " + std::to_string(config_.pp_rank) + " action " + to_string(a);
}

MicroState& PipelineExecutor::state(int stage, int micro) { return micro_[{stage, micro}]; }

StageProgram& PipelineExecutor::program(const Action& a) const { return *programs_.at(a.stage); }

const std::vector<int>* PipelineExecutor::final_grad_buckets(int stage, size_t index) const {
  if (!dp_sync_) return nullptr;
  auto last = last_grad_action_.find(stage);
  if (last == last_grad_action_.end()) return nullptr;
  // Reducing per micro-batch: every gradient action of the stage; else its last one.
  const bool reduces = dp_sync_->every_micro() ? is_backward_type(actions_[index].type) : last->second == index;
  if (!reduces) return nullptr;
  auto buckets = stage_buckets_.find(stage);
  return buckets == stage_buckets_.end() ? nullptr : &buckets->second;
}

std::vector<at::Tensor> PipelineExecutor::run(const std::vector<at::Tensor>& inputs,
                                              const std::vector<at::Tensor>& targets, double loss_multiplier) {
  const bool holds_first = holds_first_stage();
  const bool holds_last = holds_last_stage();
  if (holds_first && static_cast<int>(inputs.size()) != config_.num_micro) {
    throw std::invalid_argument("the first stage needs " + std::to_string(config_.num_micro) +
                                " micro-batch inputs, got " + std::to_string(inputs.size()));
  }
  if (holds_last && static_cast<int>(targets.size()) != config_.num_micro) {
    throw std::invalid_argument("the last stage needs " + std::to_string(config_.num_micro) +
                                " micro-batch targets, got " + std::to_string(targets.size()));
  }
  return run_streamed([&inputs](int micro) { return inputs.at(micro); },
                      [&targets](int micro) { return targets.at(micro); }, loss_multiplier);
}

std::vector<at::Tensor> PipelineExecutor::run_streamed(const MicroBatchFn& input_fn, const MicroBatchFn& target_fn,
                                                       double loss_multiplier) {
  const bool holds_first = holds_first_stage();
  const bool holds_last = holds_last_stage();
  if ((holds_first && !input_fn) || (holds_last && !target_fn)) {
    throw std::invalid_argument(std::string("pipeline rank ") + std::to_string(config_.pp_rank) + " holds the " +
                                (holds_first && !input_fn ? "first" : "last") + " stage but was given no " +
                                (holds_first && !input_fn ? "inputs" : "targets"));
  }
  // Every micro-batch drawn is checked once, where it is drawn.
  auto checked = [this](const MicroBatchFn& fn, const char* what) {
    return [this, &fn, what](int micro) {
      at::Tensor t = fn(micro);
      if (!t.defined()) {
        throw std::runtime_error("pipeline rank " + std::to_string(config_.pp_rank) + ": no " + what +
                                 " for micro-batch " + std::to_string(micro));
      }
      return t;
    };
  };
  const MicroBatchFn inputs = checked(input_fn, "input");
  const MicroBatchFn targets = checked(target_fn, "target");
  std::vector<at::Tensor> losses(holds_last ? config_.num_micro : 0);
  StepLoss loss(loss_, targets, loss_multiplier, losses);
  step_ = {&inputs, holds_last ? &loss : nullptr};
  trace_.clear();
  activity_.start_step();
  device_spans_.clear();
  const bool device_trace = config_.record_trace && device_.type() != c10::DeviceType::CPU;
  if (device_trace) step_event_ = record_event();
  step_start_ = std::chrono::steady_clock::now();
  if (comm_trace_ && config_.record_trace) comm_trace_->start_step(step_start_, step_event_);
  auto now_us = [this] {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - step_start_).count();
  };
  try {
    for (auto& [stage, program] : programs_) program->before_step(step_.loss);
    for (size_t i = 0; i < actions_.size(); ++i) {
      const Action& a = actions_[i];
      const bool traced = config_.record_trace && is_compute(a.type);
      // A traced action starts once its input has arrived: waiting for a peer is bubble, not work.
      if (traced) await_input(a);
      const double start = traced ? now_us() : 0.0;
      auto start_event = traced && device_trace ? record_event() : nullptr;
      const std::vector<int>* grads_final = final_grad_buckets(a.stage, i);
      {
        std::optional<ArmedGradSync> armed;
        if (grads_final) armed.emplace(*grads_, dp_sync_, *grads_final);
        activity_.run(a);
        execute(a);
      }
      if (traced && device_trace) {
        device_spans_.push_back({a, start_event, record_event()});
      } else if (traced) {
        trace_.push_back({a, start, now_us()});
      }
      // Buckets not launched early (gradients that autograd, not our C++, wrote) start now, in bucket order.
      if (grads_final) {
        for (int b : *grads_final) dp_sync_->launch(b, LaunchCause::ActionEnd);
      }
      reap_sends(false);
    }
    reap_sends(true);
    if (!recvs_.empty()) {
      const auto& [key, pending] = *recvs_.begin();
      throw std::runtime_error("pipeline rank " + std::to_string(config_.pp_rank) + ": receive for stage " +
                               std::to_string(std::get<0>(key)) + " micro-batch " + std::to_string(std::get<1>(key)) +
                               " was posted but never consumed");
    }
    if (dp_sync_) {
      activity_.wait_dp();
      dp_sync_->finish();
    }
    if (device_trace) resolve_device_trace();
  } catch (...) {
    step_ = {};
    micro_.clear();
    recvs_.clear();
    sends_.clear();
    grads_->wgrad().clear();
    throw;
  }
  step_ = {};
  micro_.clear();
  activity_.end_step();
  return losses;
}

void PipelineExecutor::execute(const Action& a) {
  switch (a.type) {
    case ActionType::F:
      forward(a);
      break;
    case ActionType::B:
      backward(a, /*defer_weight_grads=*/false);
      break;
    case ActionType::I:
      backward(a, /*defer_weight_grads=*/true);
      break;
    case ActionType::W:
      weight_grads(a);
      break;
    case ActionType::RECV_F:
      post_recv(a, TensorKind::Activation);
      break;
    case ActionType::RECV_B:
      post_recv(a, TensorKind::Gradient);
      break;
    case ActionType::SEND_F: {
      MicroState& s = state(a.stage, a.micro);
      if (!s.output.defined()) throw std::runtime_error(where(a) + ": nothing to send (no F ran)");
      post_send(a, TensorKind::Activation, s.output.detach());
      // A program whose backward needs only what it saved (a native chain: with recompute, the input) drops the
      // output: the pending send keeps it alive until the transfer is done.
      if (!program(a).needs_output_for_backward()) s.output.reset();
      break;
    }
    case ActionType::SEND_B: {
      MicroState& s = state(a.stage, a.micro);
      if (!s.input_grad.defined()) {
        throw std::runtime_error(where(a) + ": nothing to send (no backward ran)");
      }
      post_send(a, TensorKind::Gradient, s.input_grad);
      s.input_grad.reset();
      break;
    }
  }
}

void PipelineExecutor::forward(const Action& a) {
  MicroState& s = state(a.stage, a.micro);
  const at::Tensor input = is_first_stage(a.stage)                   ? (*step_.inputs)(a.micro)
                           : placement_.local_handoff(a.stage - 1) ? take_local_input(a)
                                                                   : take_recv(a, TensorKind::Activation);
  program(a).forward(s, a.micro, input, is_first_stage(a.stage), is_last_stage(a.stage) ? step_.loss : nullptr);
  s.forwarded = true;
}

void PipelineExecutor::backward(const Action& a, bool defer_weight_grads) {
  MicroState& s = state(a.stage, a.micro);
  if (!s.forwarded) throw std::runtime_error(where(a) + ": backward before forward");
  const at::Tensor output_grad = is_last_stage(a.stage)               ? at::Tensor()
                                 : placement_.local_handoff(a.stage) ? take_local_output_grad(a)
                                                                     : take_recv(a, TensorKind::Gradient);
  std::optional<DeferWeightGrads> defer;
  if (defer_weight_grads) defer.emplace(grads_->wgrad(), WgradKey{a.stage, a.micro});
  std::optional<OverwriteWeightGrads> overwrite;
  if (overwrite_in_backward_ && !defer_weight_grads) overwrite.emplace(*grads_);
  at::Tensor input_grad = program(a).backward(s, a.micro, output_grad, is_first_stage(a.stage),
                                              is_last_stage(a.stage) ? step_.loss : nullptr);
  if (!is_first_stage(a.stage)) s.input_grad = std::move(input_grad);
}

at::Tensor PipelineExecutor::take_local_input(const Action& a) {
  MicroState& before = state(a.stage - 1, a.micro);
  if (!before.output.defined()) {
    throw std::runtime_error(where(a) + ": stage " + std::to_string(a.stage - 1) + " has no output to hand on (no F ran)");
  }
  // Detached as a send would: the stage's input is a leaf of its own, whose gradient goes back the same way.
  at::Tensor input = before.output.detach();
  if (!program(Action{a.stage - 1, a.type, a.micro}).needs_output_for_backward()) before.output.reset();
  return input;
}

at::Tensor PipelineExecutor::take_local_output_grad(const Action& a) {
  MicroState& after = state(a.stage + 1, a.micro);
  if (!after.input_grad.defined()) {
    throw std::runtime_error(where(a) + ": stage " + std::to_string(a.stage + 1) +
                             " has no input gradient to hand back (no backward ran)");
  }
  at::Tensor grad = std::move(after.input_grad);
  after.input_grad = at::Tensor();
  return grad;
}

void PipelineExecutor::weight_grads(const Action& a) {
  if (!config_.merge_weight_grads) {
    grads_->flush(WgradKey{a.stage, a.micro});
    program(a).after_weight_grads(a.micro);
    return;
  }
  // Merged: every W of this stage but the last is a no-op; the last computes all micro-batches at once.
  if (last_w_micro_.at(a.stage) != a.micro) return;
  std::vector<WgradKey> keys;
  for (const Action& other : actions_) {
    if (other.type == ActionType::W && other.stage == a.stage) keys.push_back(WgradKey{a.stage, other.micro});
  }
  grads_->flush_merged(keys, config_.overwrite_weight_grads);
  for (const WgradKey& key : keys) program(a).after_weight_grads(key.micro);
}

std::shared_ptr<c10::Event> PipelineExecutor::record_event() {
  c10::impl::VirtualGuardImpl impl(device_.type());
  auto event = std::make_shared<c10::Event>(device_.type(), c10::EventFlag::BACKEND_DEFAULT);
  event->record(impl.getStream(device_));
  return event;
}

void PipelineExecutor::resolve_device_trace() {
  if (device_spans_.empty()) return;
  device_spans_.back().end->synchronize();
  for (const DeviceSpan& span : device_spans_) {
    // elapsedTime is in milliseconds
    trace_.push_back({span.action, step_event_->elapsedTime(*span.start) * 1e3,
                      step_event_->elapsedTime(*span.end) * 1e3});
  }
  device_spans_.clear();
}

}  // namespace hybrid
