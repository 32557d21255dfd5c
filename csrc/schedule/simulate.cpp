#include "schedule/simulate.h"

#include <algorithm>
#include <map>
#include <string>

#include "schedule/channel.h"
#include "schedule/lower.h"
#include "schedule/validate.h"

namespace hybrid {

namespace {

struct ChannelState {
  std::vector<double> send_times;  // k-th entry: when the k-th message was sent
  int posted = 0;                  // receives posted so far
};

struct PostedRecv {
  Channel channel;
  int index;    // which message of the channel it receives
  int rank;
  int pos;      // where in that rank's timeline
};

struct RankState {
  size_t pos = 0;
  double clock = 0.0;
  int live = 0;
};

int infer_micro_batches(const Schedule& schedule) {
  int m = 0;
  for (const auto& actions : schedule) {
    for (const Action& a : actions) m = std::max(m, a.micro + 1);
  }
  return std::max(m, 1);
}

}  // namespace

double Costs::of(ActionType type) const {
  switch (type) {
    case ActionType::F: return forward;
    case ActionType::B: return backward;
    case ActionType::I: return backward_input;
    case ActionType::W: return backward_weight;
    default: return 0.0;
  }
}

SimResult simulate(const Schedule& schedule, const StagePlacement& placement, const Costs& costs,
                   const std::vector<Costs>& stage_costs) {
  const int pp = placement.pp;
  const int num_stages = placement.num_stages;
  for (double c : {costs.forward, costs.backward, costs.backward_input, costs.backward_weight, costs.latency}) {
    if (!(c >= 0.0)) throw std::invalid_argument("costs and latency must be >= 0");
  }
  if (!stage_costs.empty() && static_cast<int>(stage_costs.size()) != num_stages) {
    throw std::invalid_argument("stage_costs has " + std::to_string(stage_costs.size()) + " entries for " +
                                std::to_string(num_stages) + " stages");
  }
  for (const Costs& c : stage_costs) {
    for (double v : {c.forward, c.backward, c.backward_input, c.backward_weight}) {
      if (!(v >= 0.0)) throw std::invalid_argument("stage costs must be >= 0");
    }
  }
  auto cost_of = [&](const Action& a) {
    return stage_costs.empty() ? costs.of(a.type) : stage_costs[a.stage].of(a.type);
  };
  validate(schedule, placement, infer_micro_batches(schedule));
  if (pp > 1 && !has_communication(schedule)) {
    throw std::invalid_argument("simulate needs the sends and receives of a pp > 1 schedule; "
                                "lower it with add_communication first");
  }

  SimResult result;
  result.busy.assign(pp, 0.0);
  result.peak_activations.assign(pp, 0);
  result.timeline.resize(pp);
  std::vector<RankState> ranks(pp);
  std::map<Channel, ChannelState> channels;
  std::map<std::tuple<int, int, int>, PostedRecv> posted;  // by the RECV action's (stage, type, micro)
  auto key = [](const Action& a) { return std::make_tuple(a.stage, static_cast<int>(a.type), a.micro); };

  // Advances one rank until it finishes or a compute needs a message not yet sent. Action times depend only
  // on the rank's own clock and on send times, never on the order ranks are advanced in, so sweeping the
  // ranks until nothing moves gives the same times as a global event queue.
  auto advance = [&](int r) {
    RankState& st = ranks[r];
    const auto& actions = schedule[r];
    bool moved = false;
    while (st.pos < actions.size()) {
      const Action& a = actions[st.pos];
      double start = st.clock;
      if (a.type == ActionType::SEND_F || a.type == ActionType::SEND_B) {
        channels[channel_of(a, placement)].send_times.push_back(st.clock);
      } else if (a.type == ActionType::RECV_F || a.type == ActionType::RECV_B) {
        const Channel ch = channel_of(a, placement);
        posted[key(a)] = {ch, channels[ch].posted++, r, static_cast<int>(result.timeline[r].size())};
      } else {
        if (auto recv = recv_consumed_by(a, placement)) {
          const PostedRecv& in = posted.at(key(*recv));  // validate() guarantees it was posted earlier
          const auto& sent = channels[in.channel].send_times;
          if (in.index >= static_cast<int>(sent.size())) break;  // blocked: the data is not sent yet
          start = std::max(start, sent[in.index] + costs.latency);
        }
        const double cost = cost_of(a);
        st.clock = start + cost;
        result.busy[r] += cost;
        if (a.type == ActionType::F) ++st.live;
        if (a.type == ActionType::B || a.type == ActionType::W) --st.live;
        result.peak_activations[r] = std::max(result.peak_activations[r], st.live);
      }
      result.timeline[r].push_back({a, start, st.clock});
      ++st.pos;
      moved = true;
    }
    return moved;
  };

  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < pp; ++r) moved = advance(r) || moved;
  }

  std::string stuck;
  for (int r = 0; r < pp; ++r) {
    if (ranks[r].pos == schedule[r].size()) continue;
    const Action& a = schedule[r][ranks[r].pos];
    const Action send = peer_of(*recv_consumed_by(a, placement));
    stuck += "\n  rank " + std::to_string(r) + " is stuck at " + to_string(a) + " (action #" +
             std::to_string(ranks[r].pos) + "), waiting for " + to_string(send) + " from rank " +
             std::to_string(placement.rank_of(send.stage));
  }
  if (!stuck.empty()) throw DeadlockError("schedule deadlocks: no rank can make progress." + stuck);

  // A receive's end is the arrival of its data, known only once the matching send has run.
  for (const auto& [k, in] : posted) {
    TimedAction& t = result.timeline[in.rank][in.pos];
    t.end = std::max(t.start, channels[in.channel].send_times[in.index] + costs.latency);
  }
  for (int r = 0; r < pp; ++r) result.makespan = std::max(result.makespan, ranks[r].clock);
  double total_idle = 0.0;
  for (int r = 0; r < pp; ++r) {
    result.idle.push_back(result.makespan - result.busy[r]);
    total_idle += result.idle.back();
  }
  result.bubble = result.makespan > 0.0 ? total_idle / (pp * result.makespan) : 0.0;
  return result;
}

}  // namespace hybrid
