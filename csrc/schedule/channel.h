// Which messages a pipeline program exchanges, and on which channel. Torch-free.
//
// The executor gives every (source rank -> destination rank, kind) pair its own FIFO channel (a dedicated
// 2-rank process group), so traffic on one channel never waits behind another. The lowering pass, the
// validator and the simulator all derive the messages from the compute actions through these few functions,
// so the three can never disagree about who talks to whom.
#pragma once

#include <optional>
#include <string>

#include "schedule/action.h"
#include "schedule/placement.h"

namespace hybrid {

enum class ChannelKind { Activation = 0, Gradient = 1 };

struct Channel {
  int src = 0;
  int dst = 0;
  ChannelKind kind = ChannelKind::Activation;

  bool operator<(const Channel& o) const {
    if (src != o.src) return src < o.src;
    if (dst != o.dst) return dst < o.dst;
    return kind < o.kind;
  }
  bool operator==(const Channel& o) const { return src == o.src && dst == o.dst && kind == o.kind; }
};

std::string to_string(const Channel& channel);  // "rank 0 -> rank 1 (activations)"

// The receive a compute action consumes: RECV_F for an F whose input comes from another rank, RECV_B for a
// B or I whose output gradient comes from another rank; nothing at the pipeline ends or within one rank.
std::optional<Action> recv_consumed_by(const Action& compute, const StagePlacement& placement);

// The send that ships a compute action's result: SEND_F after an F, SEND_B after a B or I, when the
// consumer lives on another rank.
std::optional<Action> send_produced_by(const Action& compute, const StagePlacement& placement);

// The other end of a message: SEND_F of stage s <-> RECV_F of stage s + 1, SEND_B of s <-> RECV_B of s - 1.
Action peer_of(const Action& comm);

// The channel a SEND_* or RECV_* travels on.
Channel channel_of(const Action& comm, const StagePlacement& placement);

}  // namespace hybrid
