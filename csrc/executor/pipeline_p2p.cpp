// The pipeline executor's point-to-point side: posting receives and sends on the channels, waiting for them, and
// recording every wait in the executor's Activity (what a hang report names).
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "executor/pipeline_executor.h"

namespace hybrid {

const Channel& PipelineExecutor::channel(const std::map<ChannelKey, Channel>& channels, int peer, TensorKind kind,
                                         const Action& a) const {
  auto it = channels.find({peer, static_cast<int>(kind)});
  if (it == channels.end()) {
    throw std::runtime_error(where(a) + ": no channel to/from pipeline rank " +
                             std::to_string(peer));
  }
  return it->second;
}

Action PipelineExecutor::recv_action(const Action& a, TensorKind kind) const {
  return Action{a.stage, kind == TensorKind::Activation ? ActionType::RECV_F : ActionType::RECV_B, a.micro};
}

int PipelineExecutor::recv_peer(const Action& a, TensorKind kind) const {
  return placement_.rank_of(kind == TensorKind::Activation ? a.stage - 1 : a.stage + 1);
}

void PipelineExecutor::post_recv(const Action& a, TensorKind kind) {
  const bool activation = kind == TensorKind::Activation;
  const int peer_stage = activation ? a.stage - 1 : a.stage + 1;
  if (peer_stage < 0 || peer_stage >= config_.num_stages) {
    throw std::runtime_error(where(a) + ": no neighbouring stage to receive from");
  }
  const TensorSpec& spec = activation ? input_specs_.at(a.stage) : output_specs_.at(a.stage);
  at::Tensor buffer = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype).device(device_));
  const Channel& ch = channel(recv_channels_, placement_.rank_of(peer_stage), kind, a);
  std::vector<at::Tensor> tensors{buffer};
  auto key = std::make_tuple(a.stage, a.micro, static_cast<int>(kind));
  if (recvs_.count(key)) throw std::runtime_error(where(a) + ": receive posted twice");
  recvs_[key] = PendingRecv{ch.group->recv(tensors, ch.peer_group_rank, /*tag=*/0), buffer};
}

void PipelineExecutor::await_input(const Action& a) {
  TensorKind kind = a.type == ActionType::F ? TensorKind::Activation : TensorKind::Gradient;
  if (a.type == ActionType::W || (kind == TensorKind::Activation && is_first_stage(a.stage)) ||
      (kind == TensorKind::Gradient && is_last_stage(a.stage))) {
    return;
  }
  auto it = recvs_.find(std::make_tuple(a.stage, a.micro, static_cast<int>(kind)));
  if (it != recvs_.end() && !it->second.waited) {
    RecordedWait waiting(activity_, WaitKind::Recv, recv_action(a, kind), recv_peer(a, kind));
    it->second.work->wait();
    it->second.waited = true;
  }
}

at::Tensor PipelineExecutor::take_recv(const Action& a, TensorKind kind) {
  auto it = recvs_.find(std::make_tuple(a.stage, a.micro, static_cast<int>(kind)));
  if (it == recvs_.end()) {
    throw std::runtime_error(where(a) + ": its input was never received (no " +
                             (kind == TensorKind::Activation ? "RECV_F" : "RECV_B") + " before it)");
  }
  PendingRecv pending = std::move(it->second);
  recvs_.erase(it);
  if (!pending.waited) {
    RecordedWait waiting(activity_, WaitKind::Recv, recv_action(a, kind), recv_peer(a, kind));
    pending.work->wait();
  }
  return pending.buffer;
}

void PipelineExecutor::post_send(const Action& a, TensorKind kind, const at::Tensor& tensor) {
  const bool activation = kind == TensorKind::Activation;
  const int peer_stage = activation ? a.stage + 1 : a.stage - 1;
  if (peer_stage < 0 || peer_stage >= config_.num_stages) {
    throw std::runtime_error(where(a) + ": no neighbouring stage to send to");
  }
  // The receiver allocated its buffer from the probed spec; anything else would be read as garbage.
  const TensorSpec& spec = activation ? output_specs_.at(a.stage) : input_specs_.at(a.stage);
  if (tensor.sizes().vec() != spec.shape || tensor.scalar_type() != spec.dtype) {
    std::ostringstream msg;
    msg << where(a) << ": sends " << tensor.scalar_type() << tensor.sizes()
        << " but the receiving stage expects " << spec.dtype << at::IntArrayRef(spec.shape)
        << " (stage outputs must keep the shape and dtype seen on the first step)";
    throw std::runtime_error(msg.str());
  }
  const Channel& ch = channel(send_channels_, placement_.rank_of(peer_stage), kind, a);
  at::Tensor payload = tensor.contiguous();
  std::vector<at::Tensor> tensors{payload};
  sends_.push_back(PendingSend{ch.group->send(tensors, ch.peer_group_rank, /*tag=*/0), payload, a,
                               placement_.rank_of(peer_stage)});
}

void PipelineExecutor::reap_sends(bool wait_all) {
  if (wait_all) {
    for (auto& s : sends_) {
      RecordedWait waiting(activity_, WaitKind::Send, s.action, s.peer_pp_rank);
      s.work->wait();
    }
    sends_.clear();
    return;
  }
  // Drop the sends that are done so their buffers free early; keep posting order for the rest.
  std::vector<PendingSend> still;
  for (auto& s : sends_) {
    if (!s.work->isCompleted()) still.push_back(std::move(s));
  }
  sends_ = std::move(still);
}


}  // namespace hybrid
