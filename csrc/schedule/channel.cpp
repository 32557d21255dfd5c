#include "schedule/channel.h"

#include <stdexcept>

namespace hybrid {

std::string to_string(const Channel& channel) {
  return "rank " + std::to_string(channel.src) + " -> rank " + std::to_string(channel.dst) +
         (channel.kind == ChannelKind::Activation ? " (activations)" : " (gradients)");
}

std::optional<Action> recv_consumed_by(const Action& compute, const StagePlacement& placement) {
  const int s = compute.stage;
  if (compute.type == ActionType::F && s > 0 && !placement.local_handoff(s - 1)) {
    return Action{s, ActionType::RECV_F, compute.micro};
  }
  const bool input_grad = compute.type == ActionType::B || compute.type == ActionType::I;
  if (input_grad && s < placement.num_stages - 1 && !placement.local_handoff(s)) {
    return Action{s, ActionType::RECV_B, compute.micro};
  }
  return std::nullopt;
}

std::optional<Action> send_produced_by(const Action& compute, const StagePlacement& placement) {
  const int s = compute.stage;
  if (compute.type == ActionType::F && s < placement.num_stages - 1 && !placement.local_handoff(s)) {
    return Action{s, ActionType::SEND_F, compute.micro};
  }
  const bool input_grad = compute.type == ActionType::B || compute.type == ActionType::I;
  if (input_grad && s > 0 && !placement.local_handoff(s - 1)) {
    return Action{s, ActionType::SEND_B, compute.micro};
  }
  return std::nullopt;
}

Action peer_of(const Action& comm) {
  switch (comm.type) {
    case ActionType::SEND_F: return {comm.stage + 1, ActionType::RECV_F, comm.micro};
    case ActionType::RECV_F: return {comm.stage - 1, ActionType::SEND_F, comm.micro};
    case ActionType::SEND_B: return {comm.stage - 1, ActionType::RECV_B, comm.micro};
    case ActionType::RECV_B: return {comm.stage + 1, ActionType::SEND_B, comm.micro};
    default: break;
  }
  throw std::invalid_argument("peer_of: " + to_string(comm) + " is not a send or receive");
}

Channel channel_of(const Action& comm, const StagePlacement& placement) {
  const bool is_send = comm.type == ActionType::SEND_F || comm.type == ActionType::SEND_B;
  const Action send = is_send ? comm : peer_of(comm);
  const Action recv = is_send ? peer_of(comm) : comm;
  const bool forward = send.type == ActionType::SEND_F;
  return {placement.rank_of(send.stage), placement.rank_of(recv.stage),
          forward ? ChannelKind::Activation : ChannelKind::Gradient};
}

}  // namespace hybrid
