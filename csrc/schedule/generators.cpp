#include "schedule/generators.h"

#include <algorithm>
#include <deque>
#include <stdexcept>

#include "schedule/lower.h"

namespace hybrid {

namespace {

// Beyond this many compute actions a request is a typo, not a pipeline; refuse before allocating.
constexpr long long kMaxComputeActions = 1LL << 24;

std::string sizes_text(int pp, int micro_batches, int virtual_stages) {
  return "pp=" + std::to_string(pp) + ", micro-batches=" + std::to_string(micro_batches) +
         ", virtual stages=" + std::to_string(virtual_stages);
}

// The 1F1B skeleton shared by 1f1b, interleaved and zb1 (as in torch's _get_1f1b_rank_ops): `warmup`
// forwards, then one forward and one backward in turn until the forwards run out, then the remaining
// backwards. forwards[j] / backwards[j] are the rank's j-th forward and backward; the backward's type is set
// here (B, or I + W).
//
// With split_backward the backward is I, and W is deferred: the W of the j-th backward is issued only
// after backward j + deferred_w, and the last deferred_w W's drain at the end, into the cool-down bubbles.
std::vector<Action> one_f_one_b_rank(const std::vector<Action>& forwards, const std::vector<Action>& backwards,
                                     int warmup, bool split_backward, int deferred_w) {
  const int total = static_cast<int>(forwards.size());
  warmup = std::min(warmup, total);
  std::vector<Action> ops;
  ops.reserve(forwards.size() * (split_backward ? 3 : 2));
  std::deque<Action> pending_w;
  int next_backward = 0;
  auto backward = [&]() {
    Action a = backwards[next_backward];
    a.type = split_backward ? ActionType::I : ActionType::B;
    ops.push_back(a);
    if (!split_backward) {
      ++next_backward;
      return;
    }
    pending_w.push_back({a.stage, ActionType::W, a.micro});
    if (next_backward >= deferred_w) {
      ops.push_back(pending_w.front());
      pending_w.pop_front();
    }
    ++next_backward;
  };
  for (int j = 0; j < warmup; ++j) ops.push_back(forwards[j]);  // warm-up
  for (int j = warmup; j < total; ++j) {                         // steady state
    ops.push_back(forwards[j]);
    backward();
  }
  while (next_backward < total) backward();  // cool-down
  for (const Action& w : pending_w) ops.push_back(w);
  return ops;
}

// The stages rank r runs under the loop placement every generator here uses, in model order.
std::vector<int> loop_stages(int rank, int pp, int virtual_stages) {
  return rank_stages(rank, pp, pp * virtual_stages, Placement::Loop);
}

// Forward (stage, micro) of a rank's single stage, micro-batches in order; backwards likewise.
std::vector<Action> one_stage_sequence(int rank, int pp, int micro_batches, ActionType type) {
  const int stage = loop_stages(rank, pp, 1).front();
  std::vector<Action> seq;
  for (int k = 0; k < micro_batches; ++k) seq.push_back({stage, type, k});
  return seq;
}

// 1F1B with one stage per rank. Rank r starts pp - r - 1 forwards ahead: exactly what fills the pipe before
// the first gradient returns, and the bound on live activations (rank 0 holds pp).
//
// zero_bubble gives ZB-H1: I in place of B, so gradients travel back sooner, and W deferred by r on rank r
// (torch's ScheduleInterleavedZeroBubble with one chunk). Rank r then holds at most
// (pp - r - 1) + r + 1 = pp activations until their W: 1F1B's bound, reached on every rank.
//
// lookahead: every rank but the last starts that many more forwards. With unit costs this changes nothing,
// but a real gradient takes a round trip (send, the later stages' forward and backward, send back, and the
// host time to launch each) that plain 1F1B leaves no work to cover: after sending forward k, rank r has only
// one backward and one forward to run before it needs backward k. Each lookahead forward adds a forward and
// a backward of cover, for one more micro-batch of live activations on the rank. The last rank computes the
// loss itself, so it gains nothing and keeps its warm-up of 0.
Schedule one_stage_1f1b(int pp, int micro_batches, bool zero_bubble, int lookahead) {
  Schedule schedule(pp);
  for (int r = 0; r < pp; ++r) {
    const int warmup = pp - r - 1 + (r < pp - 1 ? lookahead : 0);
    schedule[r] = one_f_one_b_rank(one_stage_sequence(r, pp, micro_batches, ActionType::F),
                                   one_stage_sequence(r, pp, micro_batches, ActionType::B), warmup, zero_bubble,
                                   zero_bubble ? r : 0);
  }
  return schedule;
}

// The schedules that run the v placement, two chunks per rank (v_schedules.cpp).
bool runs_v(const std::string& name) { return name == "zbv" || name == "dualpipev"; }

}  // namespace

const std::vector<std::string>& schedule_names() {
  static const std::vector<std::string> names = {"naive", "gpipe",     "1f1b", "interleaved",
                                                 "zb1",   "dualpipev", "zbv"};
  return names;
}

bool splits_backward(const std::string& name) { return name == "zb1" || name == "zbv"; }

int least_virtual_stages(const std::string& name) { return name == "interleaved" || runs_v(name) ? 2 : 1; }

int least_micro_batches(const std::string& name, int pp) {
  if (name == "dualpipev") return 2 * pp;
  return name == "interleaved" ? pp : 1;
}

void check_schedule_name(const std::string& name) {
  const auto& names = schedule_names();
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw std::invalid_argument("unknown schedule '" + name +
                                "' (expected naive, gpipe, 1f1b, interleaved, zb1, dualpipev or zbv)");
  }
}

void check_lookahead(int micro_batches, int lookahead) {
  if (lookahead > micro_batches) {  // the warm-up would ask for forwards of micro-batches the step does not have
    throw std::invalid_argument("--lookahead " + std::to_string(lookahead) + " is more than the " +
                                std::to_string(micro_batches) +
                                " micro-batches of a step: there are no forwards that far ahead");
  }
}

void check_schedule_request(const std::string& name, int pp, int micro_batches, int virtual_stages, int lookahead) {
  check_schedule_name(name);
  if (pp < 1) throw std::invalid_argument("pp must be >= 1 (got " + std::to_string(pp) + ")");
  if (micro_batches < 1) {
    throw std::invalid_argument("micro-batches must be >= 1 (got " + std::to_string(micro_batches) + ")");
  }
  if (virtual_stages < 1) {
    throw std::invalid_argument("virtual stages must be >= 1 (got " + std::to_string(virtual_stages) + ")");
  }
  if (static_cast<long long>(pp) * virtual_stages * micro_batches > kMaxComputeActions) {
    throw std::invalid_argument("schedule too large: " + sizes_text(pp, micro_batches, virtual_stages));
  }
  if (lookahead < 0) throw std::invalid_argument("--lookahead must be >= 0 (got " + std::to_string(lookahead) + ")");
  if (lookahead > 0 && name != "1f1b" && name != "zb1") {
    throw std::invalid_argument("--lookahead applies to --schedule 1f1b and zb1 only (got " + name + ")");
  }
  check_lookahead(micro_batches, lookahead);
  if (runs_v(name)) {
    if (virtual_stages != 2) {
      throw std::invalid_argument(name + " runs two stages per rank in a V (--virtual-stages must be 2, got " +
                                  std::to_string(virtual_stages) + ")");
    }
    if (name == "dualpipev" && micro_batches < 2 * pp) {
      // Its main step pairs a forward with a backward from the first micro-batch that has turned around; with
      // fewer micro-batches than stages no rank has both at once.
      throw std::invalid_argument("dualpipev needs at least 2 x pp micro-batches (got micro-batches=" +
                                  std::to_string(micro_batches) + ", pp=" + std::to_string(pp) + ")");
    }
    return;
  }
  if (virtual_stages < least_virtual_stages(name)) {
    throw std::invalid_argument("the " + name + " schedule needs --virtual-stages >= " +
                                std::to_string(least_virtual_stages(name)) + " (it interleaves model chunks; got " +
                                std::to_string(virtual_stages) + "); with one stage per rank use 1f1b");
  }
  if (name == "interleaved") {
    if (pp < 2) throw std::invalid_argument("interleaved needs pp >= 2 (got " + std::to_string(pp) + ")");
    if (micro_batches % pp != 0) {
      // Megatron's order runs micro-batches through the chunks in rounds of pp; a partial round would
      // leave a rank waiting on a forward that the order has not issued yet.
      throw std::invalid_argument("interleaved needs micro-batches to be a multiple of pp (got micro-batches=" +
                                  std::to_string(micro_batches) + ", pp=" + std::to_string(pp) + ")");
    }
  } else if (name != "gpipe" && virtual_stages != 1) {
    throw std::invalid_argument(name + " runs one stage per rank (--virtual-stages must be 1, got " +
                                std::to_string(virtual_stages) + "); use interleaved or gpipe for more");
  }
}

int activation_bound(const std::string& name, int pp, int micro_batches, int virtual_stages, int lookahead) {
  check_schedule_request(name, pp, micro_batches, virtual_stages, lookahead);
  const int m = micro_batches, v = virtual_stages;
  if (name == "naive") return 1;
  if (name == "gpipe") return m * v;
  if (name == "interleaved") return std::min(m * v, 2 * (pp - 1) + (v - 1) * pp + 1);
  if (name == "zbv") return std::min(2 * m, 2 * pp);
  if (name == "dualpipev") return 2 * pp + 1;
  return std::min(m, pp + (pp > 1 ? lookahead : 0));  // 1f1b, zb1: rank 0's warm-up plus the one in flight
}

Schedule naive_compute(int pp, int micro_batches) {
  // Stop-and-wait needs no coordination beyond data flow: each rank runs F then B of one micro-batch, and
  // the next F on rank 0 waits for that B, which waits for the whole pipeline's backward.
  Schedule schedule(pp);
  for (int r = 0; r < pp; ++r) {
    const int stage = loop_stages(r, pp, 1).front();
    for (int k = 0; k < micro_batches; ++k) {
      schedule[r].push_back({stage, ActionType::F, k});
      schedule[r].push_back({stage, ActionType::B, k});
    }
  }
  return schedule;
}

Schedule gpipe_compute(int pp, int micro_batches, int virtual_stages) {
  Schedule schedule(pp);
  for (int r = 0; r < pp; ++r) {
    const std::vector<int> stages = loop_stages(r, pp, virtual_stages);
    for (int c = 0; c < virtual_stages; ++c) {
      for (int k = 0; k < micro_batches; ++k) schedule[r].push_back({stages[c], ActionType::F, k});
    }
    for (int c = virtual_stages - 1; c >= 0; --c) {
      for (int k = 0; k < micro_batches; ++k) schedule[r].push_back({stages[c], ActionType::B, k});
    }
  }
  return schedule;
}

Schedule one_f_one_b_compute(int pp, int micro_batches, int lookahead) {
  return one_stage_1f1b(pp, micro_batches, /*zero_bubble=*/false, lookahead);
}

Schedule interleaved_compute(int pp, int micro_batches, int virtual_stages) {
  // Megatron's order: the j-th forward of a rank runs chunk (j / pp) mod v on micro-batch
  // (j / (pp v)) pp + j mod pp, i.e. pp micro-batches go through chunk 0, then the same pp through chunk 1, ...
  // Backwards walk the chunks in reverse. Warm-up is (v - 1) pp forwards to reach the last chunk, plus two
  // per hop to the last rank (forward out, backward back).
  Schedule schedule(pp);
  const int per_round = pp * virtual_stages;
  const int total = micro_batches * virtual_stages;
  for (int r = 0; r < pp; ++r) {
    const std::vector<int> stages = loop_stages(r, pp, virtual_stages);
    std::vector<Action> forwards, backwards;
    for (int j = 0; j < total; ++j) {
      const int chunk = (j % per_round) / pp;
      const int micro = (j / per_round) * pp + j % pp;
      forwards.push_back({stages[chunk], ActionType::F, micro});
      backwards.push_back({stages[virtual_stages - 1 - chunk], ActionType::B, micro});
    }
    const int warmup = (pp - r - 1) * 2 + (virtual_stages - 1) * pp;
    schedule[r] = one_f_one_b_rank(forwards, backwards, warmup, /*split_backward=*/false, 0);
  }
  return schedule;
}

Schedule zb1_compute(int pp, int micro_batches, int lookahead) {
  return one_stage_1f1b(pp, micro_batches, /*zero_bubble=*/true, lookahead);
}

Schedule make_compute_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages,
                               int lookahead) {
  check_schedule_request(name, pp, micro_batches, virtual_stages, lookahead);
  if (name == "naive") return naive_compute(pp, micro_batches);
  if (name == "gpipe") return gpipe_compute(pp, micro_batches, virtual_stages);
  if (name == "1f1b") return one_f_one_b_compute(pp, micro_batches, lookahead);
  if (name == "interleaved") return interleaved_compute(pp, micro_batches, virtual_stages);
  if (name == "zbv") return zbv_compute(pp, micro_batches);
  if (name == "dualpipev") return dualpipev_compute(pp, micro_batches);
  return zb1_compute(pp, micro_batches, lookahead);
}

Placement schedule_placement(const std::string& name) {
  check_schedule_name(name);
  return runs_v(name) ? Placement::V : Placement::Loop;
}

StagePlacement schedule_stage_placement(const std::string& name, int pp, int virtual_stages) {
  return StagePlacement(pp, pp * virtual_stages, schedule_placement(name));
}

Schedule make_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages, int lookahead) {
  // The request's own checks first (their lines name the flag at fault), then the placement's.
  const Schedule compute = make_compute_schedule(name, pp, micro_batches, virtual_stages, lookahead);
  return add_communication(compute, schedule_stage_placement(name, pp, virtual_stages));
}

}  // namespace hybrid
