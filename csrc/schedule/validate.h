// Structural check of a pipeline program. Torch-free.
#pragma once

#include "schedule/action.h"
#include "schedule/placement.h"

namespace hybrid {

// Throws std::invalid_argument naming the rank, the action's position in its list and the action, for the
// first of these problems:
//   - a stage outside 0 .. num_stages - 1, a micro-batch outside 0 .. micro_batches - 1, a stage on a rank
//     the placement does not give it, an action listed twice;
//   - order within a rank: F of stage s after F of stage s - 1 when both live here; B/I after the F of the
//     same stage and after the backward of stage s + 1 when that lives here; W after its I; B never mixed
//     with I/W for one (stage, micro-batch);
//   - counts: every micro-batch has an F on every stage and either a B or an I and a W;
//   - with communication (any SEND_*/RECV_* present): every cross-rank hop has exactly its send and its
//     receive, a send comes after the compute that produces its tensor, a receive is posted before the compute
//     that consumes it, and on every channel the k-th send pairs with the k-th receive.
// Forward-in-order and backward-in-reverse across ranks follow from the last group: a compute can only use
// data that the previous stage sent. A compute-only list with pp > 1 is checked without that group.
void validate(const Schedule& schedule, const StagePlacement& placement, int micro_batches);

}  // namespace hybrid
