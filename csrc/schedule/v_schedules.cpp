// The V-shaped schedules: two stages per rank on the v placement (placement.h), rank r holding stage
// r (its "down" chunk) and 2 pp - 1 - r (its "up" chunk). A micro-batch enters and leaves on rank 0.
#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "schedule/generators.h"

namespace hybrid {

namespace {

// One rank's program under construction: per-(stage, kind) micro-batch counters, as in both reference
// generators, so each action names the next micro-batch of its stage.
class RankProgram {
 public:
  RankProgram(int down, int up, int micro_batches) : down_(down), up_(up), micro_batches_(micro_batches) {}

  int down() const { return down_; }
  int up() const { return up_; }
  int forwards(int stage) { return count_[{stage, ActionType::F}]; }
  int backwards(int stage) { return count_[{stage, ActionType::I}]; }
  int weights(int stage) { return count_[{stage, ActionType::W}]; }

  void forward(int stage) { emit(stage, ActionType::F, count_[{stage, ActionType::F}]++); }

  // The input-gradient half alone (I, its W queued), or the whole backward (B).
  void backward(int stage, bool split) {
    const int micro = count_[{stage, ActionType::I}]++;
    if (split) {
      emit(stage, ActionType::I, micro);
      pending_w_.push_back({stage, micro});
    } else {
      emit(stage, ActionType::B, micro);
      ++count_[{stage, ActionType::W}];
    }
  }

  // The W of `stage`'s next micro-batch, in micro-batch order.
  void weight(int stage) { emit(stage, ActionType::W, count_[{stage, ActionType::W}]++); }

  // The oldest queued W, if any (DualPipeV fills bubbles with whatever weight gradient waits longest).
  void oldest_weight() {
    if (pending_w_.empty()) return;
    const auto [stage, micro] = pending_w_.front();
    pending_w_.pop_front();
    emit(stage, ActionType::W, micro);
    ++count_[{stage, ActionType::W}];
  }

  std::vector<Action> take() { return std::move(ops_); }

 private:
  // Micro-batches past the request are generated (a full pipeline's pattern) but not emitted: dropping
  // every action of a micro-batch keeps a deadlock-free program deadlock-free.
  void emit(int stage, ActionType type, int micro) {
    if (micro < micro_batches_) ops_.push_back({stage, type, micro});
  }

  int down_, up_, micro_batches_;
  std::map<std::pair<int, ActionType>, int> count_;
  std::deque<std::pair<int, int>> pending_w_;
  std::vector<Action> ops_;
};

RankProgram rank_program(int rank, int pp, int micro_batches) {
  const std::vector<int> stages = rank_stages(rank, pp, 2 * pp, Placement::V);
  return RankProgram(stages.front(), stages.back(), micro_batches);
}

}  // namespace

// ZB-V (Qi et al., arXiv 2401.10241, section 6; torch's ScheduleZBVZeroBubble). Rank r warms up with
// 2 (pp - r) - 1 down-chunk forwards, then r pairs of (up F, down F), then pp - r rounds of (up F, I, W):
// the last rank's up chunk turns the first micro-batch around at once. The steady state alternates
// (down F, down I, down W, up F, up I, up W); the cool-down runs the remaining I's first and W's last, into the
// bubbles. With F = I = W every rank is busy from its first action to the end: the bubble is only the
// warm-up's r-step offset and the matching tail. A full pattern needs 2 pp - 1 micro-batches; fewer are the
// same pattern with the missing micro-batches dropped.
Schedule zbv_compute(int pp, int micro_batches) {
  const int full = std::max(2 * pp - 1, micro_batches);
  Schedule schedule(pp);
  for (int r = 0; r < pp; ++r) {
    RankProgram p = rank_program(r, pp, micro_batches);
    const int down = p.down(), up = p.up();
    auto backward_and_weight = [&](int stage) {
      p.backward(stage, /*split=*/true);
      p.weight(stage);
    };
    for (int i = 0; i < 2 * (pp - r) - 1; ++i) p.forward(down);
    for (int i = 0; i < r; ++i) {
      p.forward(up);
      p.forward(down);
    }
    for (int i = 0; i < pp - r; ++i) {
      p.forward(up);
      backward_and_weight(up);
    }
    while (p.forwards(up) < p.forwards(down) || p.forwards(down) < full) {
      if (p.forwards(down) < full) p.forward(down);
      backward_and_weight(down);
      p.forward(up);
      backward_and_weight(up);
    }
    for (int i = 0; i < r; ++i) {
      p.backward(down, true);
      p.backward(up, true);
    }
    for (int i = 0; i < pp - r; ++i) {
      p.backward(down, true);
      p.weight(down);
    }
    while (p.weights(up) < p.backwards(up)) p.weight(up);
    while (p.weights(down) < p.backwards(down)) p.weight(down);
    schedule[r] = p.take();
  }
  return schedule;
}

// DualPipeV: DeepSeek's DualPipe (arXiv 2412.19437) folded onto the V (torch's ScheduleDualPipeV). A micro-batch
// goes down the ranks on their down chunks and back up on their up chunks. After a warm-up of forwards, each
// rank runs pairs "forward of one micro-batch, backward of another" (down F with up B, then up F with down B),
// the pairs DualPipe overlaps; the cool-down splits the later backwards into I and W and fills the bubbles with
// the W's. Needs m >= 2 pp micro-batches (checked by check_schedule_request).
//
// A pair is two consecutive actions, the forward first: the executor runs them one after the other, and the
// simulator charges F + B for the pair (no overlap).
Schedule dualpipev_compute(int pp, int micro_batches) {
  Schedule schedule(pp);
  for (int r = 0; r < pp; ++r) {
    RankProgram p = rank_program(r, pp, micro_batches);
    const int down = p.down(), up = p.up();
    auto pair = [&](int forward_stage, int backward_stage) {
      p.forward(forward_stage);
      p.backward(backward_stage, /*split=*/false);
    };
    for (int i = 0; i < 2 * (pp - r - 1); ++i) p.forward(down);  // 1: down F
    for (int i = 0; i < r + 1; ++i) {                             // 2: down F, up F
      p.forward(down);
      p.forward(up);
    }
    for (int i = 0; i < pp - r - 1; ++i) {  // 3: up I, W, up F (zero bubble)
      p.backward(up, true);
      p.oldest_weight();
      p.forward(up);
    }
    for (int i = 0; i < micro_batches - 2 * pp + r + 1; ++i) {  // 4: the main step, two pairs
      if (i == 0 && r == pp - 1) {
        // The last rank's first up backward follows its own forward at once: running them as a pair would
        // only delay the gradient every other rank waits for.
        p.forward(down);
        p.backward(up, false);
      } else {
        pair(down, up);
      }
      pair(up, down);
    }
    for (int i = 0; i < pp - r - 1; ++i) {  // 5: up B, then a pair
      p.backward(up, false);
      pair(up, down);
    }
    // 6: the remaining backwards of both chunks; the second half split into I (W queued). Odd ranks switch
    // one backward earlier than even ones, so neighbours' W's land in each other's waits.
    bool split = false;
    const int step6 = r + 1;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && r % 2 == 1) split = true;
      p.backward(up, split);
      if (i == step6 / 2 && r % 2 == 0) split = true;
      p.backward(down, split);
    }
    for (int i = 0; i < pp - r - 1; ++i) {  // 7: a queued W, then a down backward
      p.oldest_weight();
      p.backward(down, split);
    }
    for (int i = 0; i < r + 1; ++i) p.oldest_weight();  // 8: the queued W's
    schedule[r] = p.take();
  }
  return schedule;
}

}  // namespace hybrid
