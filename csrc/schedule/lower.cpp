#include "schedule/lower.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "schedule/channel.h"

namespace hybrid {

namespace {

using ActionKey = std::tuple<int, int, int>;

ActionKey key_of(const Action& a) { return {a.stage, static_cast<int>(a.type), a.micro}; }

struct PlannedRecv {
  Action recv;
  int slot;   // posted just before the rank's compute number `slot`
  int order;  // position of the matching send on its channel
};

}  // namespace

bool has_communication(const Schedule& schedule) {
  for (const auto& actions : schedule) {
    for (const Action& a : actions) {
      if (is_comm(a.type)) return true;
    }
  }
  return false;
}

void check_pipeline_shape(const Schedule& schedule, const StagePlacement& placement) {
  if (static_cast<int>(schedule.size()) != placement.pp) {
    throw std::invalid_argument("schedule has " + std::to_string(schedule.size()) + " rank lists, expected pp=" +
                                std::to_string(placement.pp));
  }
}

Schedule add_communication(const Schedule& compute, const StagePlacement& placement) {
  check_pipeline_shape(compute, placement);
  const int pp = placement.pp;
  const int num_stages = placement.num_stages;
  // Every send's position in its channel's FIFO, in the order the sending rank issues them.
  std::map<ActionKey, int> send_order;
  std::map<Channel, int> channel_sends;
  for (int r = 0; r < pp; ++r) {
    for (const Action& a : compute[r]) {
      const std::string where = "rank " + std::to_string(r) + " (" + to_string(a) + ")";
      if (is_comm(a.type)) {
        throw std::invalid_argument("add_communication expects compute-only lists, but " + where +
                                    " is already a send/receive");
      }
      if (a.stage < 0 || a.stage >= num_stages || placement.rank_of(a.stage) != r) {
        throw std::invalid_argument("add_communication: " + where + " is not a stage of rank " + std::to_string(r));
      }
      if (auto send = send_produced_by(a, placement)) {
        send_order[key_of(*send)] = channel_sends[channel_of(*send, placement)]++;
      }
    }
  }

  Schedule lowered(pp);
  for (int r = 0; r < pp; ++r) {
    const auto& actions = compute[r];
    // Desired slot: right after the previous compute. Then, per channel in send order, a receive may not
    // be posted later than the one after it (suffix minimum), which keeps the channel FIFO.
    std::map<Channel, std::vector<PlannedRecv>> by_channel;
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      if (auto recv = recv_consumed_by(actions[i], placement)) {
        auto it = send_order.find(key_of(peer_of(*recv)));
        if (it == send_order.end()) {
          throw std::invalid_argument("add_communication: rank " + std::to_string(r) + " (" +
                                      to_string(actions[i]) + ") consumes " + to_string(peer_of(*recv)) +
                                      ", which no rank produces");
        }
        by_channel[channel_of(*recv, placement)].push_back({*recv, i, it->second});
      }
    }
    std::vector<PlannedRecv> planned;
    for (auto& [channel, recvs] : by_channel) {
      std::sort(recvs.begin(), recvs.end(),
                [](const PlannedRecv& a, const PlannedRecv& b) { return a.order < b.order; });
      for (int j = static_cast<int>(recvs.size()) - 2; j >= 0; --j) {
        recvs[j].slot = std::min(recvs[j].slot, recvs[j + 1].slot);
      }
      planned.insert(planned.end(), recvs.begin(), recvs.end());
    }
    // Within a slot keep each channel's send order; across channels the order is immaterial.
    std::stable_sort(planned.begin(), planned.end(), [](const PlannedRecv& a, const PlannedRecv& b) {
      return std::tie(a.slot, a.order) < std::tie(b.slot, b.order);
    });

    auto& out = lowered[r];
    size_t next_recv = 0;
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      while (next_recv < planned.size() && planned[next_recv].slot == i) out.push_back(planned[next_recv++].recv);
      out.push_back(actions[i]);
      if (auto send = send_produced_by(actions[i], placement)) out.push_back(*send);
    }
  }
  return lowered;
}

}  // namespace hybrid
