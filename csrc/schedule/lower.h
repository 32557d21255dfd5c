// Lowering: compute-only programs -> programs with explicit sends and receives. Torch-free, pure.
#pragma once

#include "schedule/action.h"

namespace hybrid {

// Inserts SEND_F/SEND_B right after the compute that produces the tensor (isend costs the sender nothing,
// and the peer can start as early as possible), and each RECV_F/RECV_B right after the compute before its
// consumer, so the transfer overlaps that compute. Where a channel's sender emits messages in a different
// order than the receiver consumes them, receives are pulled earlier so that they are posted in the
// sender's order: a channel is FIFO, and a receive posted early costs nothing.
//
// The result is deadlock-free whenever the compute order is (no rank waits for data whose producer waits
// on it). Throws std::invalid_argument if the input already holds communication, has the wrong number of
// ranks, places a stage on the wrong rank, or consumes a message that no rank produces.
Schedule add_communication(const Schedule& compute, int pp, int num_stages);

// True if any rank's list holds a SEND_* or RECV_*.
bool has_communication(const Schedule& schedule);

// Throws std::invalid_argument unless pp >= 1, num_stages a positive multiple of pp and schedule has pp lists.
void check_pipeline_shape(const Schedule& schedule, int pp, int num_stages);

}  // namespace hybrid
