// What one pipeline executor is doing right now, kept so that a step that hangs can say where
// (hybrid_engine/runtime/hang_report.py): the action it runs and, while it waits on a peer, what it waits for.
// Torch-free.
//
// The executor's own thread writes it at every action and around every wait; any thread may read it (the SIGTERM
// reporter while the executor is blocked inside a wait, the driver after a communication timeout), hence the
// lock. It belongs to one executor object: two engines in one process each keep their own. A step that throws
// leaves the record as it was at the throw, which is the point: it names the wait that timed out.
#pragma once

#include <exception>
#include <mutex>
#include <optional>

#include "schedule/action.h"

namespace hybrid {

enum class WaitKind {
  Nothing = 0,  // running `action` (a compute action: any MP collective inside it is the stage's own)
  Recv = 1,     // waiting for the message of `awaited` (a RECV_F / RECV_B) from `peer_pp_rank`, needed by `action`
  Send = 2,     // waiting for the send `awaited` (a SEND_F / SEND_B) to `peer_pp_rank` to complete
  DpSync = 3,   // waiting for the step's DP gradient collectives (all-reduce or reduce-scatter of the buckets)
};

struct ActivitySnapshot {
  bool in_step = false;           // inside run(); a step that threw stays in_step
  std::optional<Action> action;   // the action being run (none before the first of a step and in DP sync)
  WaitKind wait = WaitKind::Nothing;
  std::optional<Action> awaited;  // Recv / Send: the communication action
  int peer_pp_rank = -1;          // Recv / Send: the pipeline rank on the other end
  int steps_started = 0;          // steps this executor has begun
};

class Activity {
 public:
  void start_step();
  void run(const Action& action);
  void wait(WaitKind kind, const Action& awaited, int peer_pp_rank);
  void wait_dp();
  void resume();  // a wait is over: back to running the current action
  void end_step();
  ActivitySnapshot snapshot() const;

 private:
  mutable std::mutex mutex_;
  ActivitySnapshot now_;
};

// RAII: the wait on `awaited` is recorded for the scope of a blocking call and cleared when it returns (an
// exception leaves it recorded).
class RecordedWait {
 public:
  RecordedWait(Activity& activity, WaitKind kind, const Action& awaited, int peer_pp_rank)
      : activity_(activity) {
    activity_.wait(kind, awaited, peer_pp_rank);
  }
  ~RecordedWait() {
    if (std::uncaught_exceptions() == 0) activity_.resume();
  }
  RecordedWait(const RecordedWait&) = delete;
  RecordedWait& operator=(const RecordedWait&) = delete;

 private:
  Activity& activity_;
};

}  // namespace hybrid
