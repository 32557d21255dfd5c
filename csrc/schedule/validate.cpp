#include "schedule/validate.h"

#include <map>
#include <stdexcept>
#include <vector>

#include "schedule/channel.h"
#include "schedule/lower.h"

namespace hybrid {

namespace {

constexpr int kNumTypes = 8;

// Where each action was seen: its position in its owner's list, or -1. Since every action must sit on the
// rank owning its stage, "seen on this rank before position i" is simply "seen at a position < i".
class Seen {
 public:
  Seen(int num_stages, int micro_batches)
      : num_stages_(num_stages), micro_batches_(micro_batches),
        pos_(static_cast<size_t>(kNumTypes) * num_stages * micro_batches, -1) {}
  int& at(const Action& a) {
    return pos_[(static_cast<size_t>(a.type) * num_stages_ + a.stage) * micro_batches_ + a.micro];
  }
  bool has(const Action& a) { return at(a) >= 0; }

 private:
  int num_stages_;
  int micro_batches_;
  std::vector<int> pos_;
};

std::string where(int rank, int pos, const Action& a) {
  return "rank " + std::to_string(rank) + ", action #" + std::to_string(pos) + " (" + to_string(a) + ")";
}

[[noreturn]] void fail(int rank, int pos, const Action& a, const std::string& why) {
  throw std::invalid_argument("invalid schedule: " + where(rank, pos, a) + ": " + why);
}

[[noreturn]] void fail_missing(int rank, const Action& missing, const std::string& why) {
  throw std::invalid_argument("invalid schedule: rank " + std::to_string(rank) + " is missing " +
                              to_string(missing) + ": " + why);
}

Action with_type(const Action& a, ActionType type) { return {a.stage, type, a.micro}; }

struct Located {
  Action action;
  int rank;
  int pos;
};

void check_channels(const Schedule& schedule, const StagePlacement& placement) {
  const int pp = placement.pp;
  std::map<Channel, std::vector<Located>> sends, recvs;
  for (int r = 0; r < pp; ++r) {
    for (int i = 0; i < static_cast<int>(schedule[r].size()); ++i) {
      const Action& a = schedule[r][i];
      if (!is_comm(a.type)) continue;
      const bool is_send = a.type == ActionType::SEND_F || a.type == ActionType::SEND_B;
      (is_send ? sends : recvs)[channel_of(a, placement)].push_back({a, r, i});
    }
  }
  for (const auto& [channel, out] : sends) {
    const auto& in = recvs[channel];  // counts already checked: same length, same messages
    for (size_t k = 0; k < out.size() && k < in.size(); ++k) {
      if (peer_of(out[k].action) != in[k].action) {
        throw std::invalid_argument(
            "invalid schedule: channel " + to_string(channel) + " is FIFO, but its message #" + std::to_string(k) +
            " is sent by " + where(out[k].rank, out[k].pos, out[k].action) + " and received by " +
            where(in[k].rank, in[k].pos, in[k].action) + "; sends and receives must pair up in the same order");
      }
    }
  }
}

}  // namespace

void validate(const Schedule& schedule, const StagePlacement& placement, int micro_batches) {
  check_pipeline_shape(schedule, placement);
  const int pp = placement.pp;
  const int num_stages = placement.num_stages;
  if (micro_batches < 1) {
    throw std::invalid_argument("micro_batches must be >= 1 (got " + std::to_string(micro_batches) + ")");
  }
  // The bookkeeping below is a dense table over (type, stage, micro-batch); refuse absurd sizes up front.
  if (static_cast<long long>(num_stages) * micro_batches > (1LL << 26)) {
    throw std::invalid_argument("schedule too large to validate: num_stages=" + std::to_string(num_stages) +
                                ", micro_batches=" + std::to_string(micro_batches));
  }
  const bool with_comms = has_communication(schedule);
  const int last = num_stages - 1;
  Seen seen(num_stages, micro_batches);

  for (int r = 0; r < pp; ++r) {
    for (int i = 0; i < static_cast<int>(schedule[r].size()); ++i) {
      const Action& a = schedule[r][i];
      if (a.stage < 0 || a.stage > last) fail(r, i, a, "stage out of range 0.." + std::to_string(last));
      if (a.micro < 0 || a.micro >= micro_batches) {
        fail(r, i, a, "micro-batch out of range 0.." + std::to_string(micro_batches - 1));
      }
      if (placement.rank_of(a.stage) != r) {
        fail(r, i, a, "stage " + std::to_string(a.stage) + " belongs to rank " +
                          std::to_string(placement.rank_of(a.stage)) + " (" + to_string(placement.kind) +
                          " placement)");
      }
      if (seen.has(a)) fail(r, i, a, "already listed at action #" + std::to_string(seen.at(a)));
      auto require = [&](const Action& before, const std::string& why) {
        if (!seen.has(before)) fail(r, i, a, "needs " + to_string(before) + " earlier on this rank (" + why + ")");
      };
      switch (a.type) {
        case ActionType::F:
          if (a.stage > 0) {
            if (auto recv = recv_consumed_by(a, placement)) {
              if (with_comms) require(*recv, "the receive of its input must be posted before it is consumed");
            } else {
              require({a.stage - 1, ActionType::F, a.micro}, "forward goes through the stages in order");
            }
          }
          break;
        case ActionType::B:
        case ActionType::I: {
          require(with_type(a, ActionType::F), "backward follows the forward");
          const ActionType other = a.type == ActionType::B ? ActionType::I : ActionType::B;
          if (seen.has(with_type(a, other))) fail(r, i, a, "a stage's backward is either B or I + W, not both");
          if (a.stage < last) {
            if (auto recv = recv_consumed_by(a, placement)) {
              if (with_comms) require(*recv, "the receive of its gradient must be posted before it is consumed");
            } else if (!seen.has({a.stage + 1, ActionType::B, a.micro}) &&
                       !seen.has({a.stage + 1, ActionType::I, a.micro})) {
              fail(r, i, a, "needs the backward of stage " + std::to_string(a.stage + 1) +
                                " earlier on this rank (backward goes through the stages in reverse)");
            }
          }
          break;
        }
        case ActionType::W:
          require(with_type(a, ActionType::I), "the weight gradient comes after the input gradient");
          break;
        case ActionType::SEND_F:
        case ActionType::SEND_B: {
          const Action producer = with_type(a, a.type == ActionType::SEND_F ? ActionType::F : ActionType::B);
          const Action split = with_type(a, ActionType::I);
          if (send_produced_by(producer, placement) != a) fail(r, i, a, "no other rank needs this tensor");
          if (!seen.has(producer) && !(a.type == ActionType::SEND_B && seen.has(split))) {
            fail(r, i, a, "sent before the compute that produces it");
          }
          break;
        }
        case ActionType::RECV_F:
        case ActionType::RECV_B: {
          const Action consumer = with_type(a, a.type == ActionType::RECV_F ? ActionType::F : ActionType::B);
          if (recv_consumed_by(consumer, placement) != a) fail(r, i, a, "no other rank sends this tensor");
          break;
        }
      }
      seen.at(a) = i;
    }
  }

  // Counts: each action is listed at most once (checked above), so "present" is "exactly once".
  for (int s = 0; s < num_stages; ++s) {
    const int r = placement.rank_of(s);
    for (int k = 0; k < micro_batches; ++k) {
      const Action f{s, ActionType::F, k};
      if (!seen.has(f)) fail_missing(r, f, "every micro-batch goes forward through every stage");
      const Action b = with_type(f, ActionType::B);
      const Action in = with_type(f, ActionType::I);
      const Action w = with_type(f, ActionType::W);
      if (!seen.has(b) && !seen.has(in)) fail_missing(r, b, "every micro-batch goes backward through every stage");
      if (seen.has(in) && !seen.has(w)) fail_missing(r, w, "every I needs its W");
      if (seen.has(w) && !seen.has(in)) fail_missing(r, in, "every W needs its I");
      if (!with_comms) continue;
      for (const Action& compute : {f, seen.has(b) ? b : in}) {
        for (auto comm : {recv_consumed_by(compute, placement), send_produced_by(compute, placement)}) {
          if (comm && !seen.has(*comm)) {
            fail_missing(r, *comm, to_string(compute) + " exchanges data with another rank");
          }
        }
      }
    }
  }
  if (with_comms) check_channels(schedule, placement);
}

}  // namespace hybrid
