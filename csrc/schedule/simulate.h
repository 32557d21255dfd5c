// Dry run of all ranks' programs together. Torch-free.
//
// Models exactly what the executor does: compute actions run one after another on their rank and take
// their cost; SEND_* is an isend (free for the sender); RECV_* posts an irecv (free); a compute that consumes
// a received tensor waits until it has arrived, at send time + latency. Channels are independent FIFOs, so
// nothing else blocks. A rank's clock starts at 0.
#pragma once

#include <stdexcept>
#include <vector>

#include "schedule/action.h"
#include "schedule/placement.h"

namespace hybrid {

// Durations of one action (one stage, one micro-batch), in any time unit, and the per-message latency.
// Defaults: B = I + W = 2 F, the usual ratio for a transformer layer.
struct Costs {
  double forward = 1.0;          // F
  double backward = 2.0;         // B
  double backward_input = 1.0;   // I
  double backward_weight = 1.0;  // W
  double latency = 0.0;          // from a send to the data's arrival

  double of(ActionType type) const;  // 0 for SEND_*/RECV_*
};

struct TimedAction {
  Action action;
  double start = 0.0;  // compute: start; SEND: when issued; RECV: when posted
  double end = 0.0;    // compute: end;   SEND: when issued; RECV: when the data arrived
};

struct SimResult {
  double makespan = 0.0;                          // the last rank's finish time
  std::vector<double> busy;                       // per rank: total compute time
  std::vector<double> idle;                       // per rank: makespan - busy
  double bubble = 0.0;                            // sum(idle) / (ranks * makespan)
  std::vector<int> peak_activations;              // per rank: most micro-batch activations held at once
  std::vector<std::vector<TimedAction>> timeline;  // per rank, in list order
};

// Raised when no rank can make progress; the message lists, per stuck rank, the action it waits at and
// the send it waits for.
class DeadlockError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Validates the schedule first (validate.h, with micro_batches = 1 + the largest micro-batch index), so a
// malformed program raises std::invalid_argument naming the rank and action. With pp > 1 the schedule
// must hold its communication (add_communication). An activation counts as live from its F until its B,
// or until its W when the backward is split (W still needs the stashed inputs).
// stage_costs (optional, one per stage): the durations of that stage's actions instead of `costs`'s, e.g. the
// medians measured in a trace (a "calibrated" simulation); the latency stays `costs.latency`.
SimResult simulate(const Schedule& schedule, const StagePlacement& placement, const Costs& costs = Costs(),
                   const std::vector<Costs>& stage_costs = {});

}  // namespace hybrid
