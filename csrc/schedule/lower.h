// Lowering: compute-only programs -> programs with explicit sends and receives. Torch-free, pure.
#pragma once

#include "schedule/action.h"
#include "schedule/placement.h"

namespace hybrid {

// Inserts SEND_F/SEND_B right after the compute that produces the tensor (isend costs the sender nothing,
// and the peer can start as early as possible), and each RECV_F/RECV_B right after the compute before its
// consumer, so the transfer overlaps that compute. Where a channel's sender emits messages in a different
// order than the receiver consumes them, receives are pulled earlier so that they are posted in the
// sender's order: a channel is FIFO, and a receive posted early costs nothing.
//
// The result is deadlock-free whenever the compute order is (no rank waits for data whose producer waits
// on it). Throws std::invalid_argument if the input already holds communication, has the wrong number of
// ranks, places a stage on a rank `placement` does not give it, or consumes a message that no rank produces.
// A hand-off between two stages of one rank (the v placement's turn) is no message: the executor passes it on.
Schedule add_communication(const Schedule& compute, const StagePlacement& placement);

// True if any rank's list holds a SEND_* or RECV_*.
bool has_communication(const Schedule& schedule);

// Throws std::invalid_argument unless the schedule has one list per pipeline rank of `placement`.
void check_pipeline_shape(const Schedule& schedule, const StagePlacement& placement);

}  // namespace hybrid
