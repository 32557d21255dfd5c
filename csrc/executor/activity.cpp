#include "executor/activity.h"

namespace hybrid {

void Activity::start_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int started = now_.steps_started + 1;
  now_ = ActivitySnapshot{};
  now_.in_step = true;
  now_.steps_started = started;
}

void Activity::run(const Action& action) {
  std::lock_guard<std::mutex> lock(mutex_);
  now_.action = action;
  now_.wait = WaitKind::Nothing;
  now_.awaited.reset();
  now_.peer_pp_rank = -1;
}

void Activity::wait(WaitKind kind, const Action& awaited, int peer_pp_rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  now_.wait = kind;
  now_.awaited = awaited;
  now_.peer_pp_rank = peer_pp_rank;
}

void Activity::wait_dp() {
  std::lock_guard<std::mutex> lock(mutex_);
  now_.action.reset();
  now_.wait = WaitKind::DpSync;
  now_.awaited.reset();
  now_.peer_pp_rank = -1;
}

void Activity::resume() {
  std::lock_guard<std::mutex> lock(mutex_);
  now_.wait = WaitKind::Nothing;
  now_.awaited.reset();
  now_.peer_pp_rank = -1;
}

void Activity::end_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  const int started = now_.steps_started;
  now_ = ActivitySnapshot{};
  now_.steps_started = started;
}

ActivitySnapshot Activity::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return now_;
}

}  // namespace hybrid
