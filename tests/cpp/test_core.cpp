// Torch-free core, tested alone: tests/cpp/test_cpp_core.py compiles this with csrc/grid/*.cpp and
// csrc/schedule/*.cpp using a plain C++17 compiler and no torch include path, then runs it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "grid/process_grid.h"
#include "schedule/action.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
#include "schedule/placement.h"
#include "schedule/simulate.h"
#include "schedule/validate.h"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

template <typename F>
bool throws(F&& f) {
  try {
    f();
  } catch (const std::exception&) {
    return true;
  }
  return false;
}

void test_grid_worked_example() {
  // The dp=2 pp=2 mp=2 example of process_grid.h, order "mp-dp-pp".
  hybrid::ProcessGrid grid(2, 2, 2);
  check(grid.world_size() == 8, "world size 8");
  check(grid.coords(5).dp == 0 && grid.coords(5).pp == 1 && grid.coords(5).mp == 1, "rank 5 is (dp0, pp1, mp1)");
  check(grid.rank_of({1, 1, 0}) == 6, "(dp1, pp1, mp0) is rank 6");
  check(grid.group_of(1, hybrid::Axis::MP) == std::vector<int>({0, 1}), "MP group of 1 is [0,1]");
  check(grid.group_of(1, hybrid::Axis::DP) == std::vector<int>({1, 3}), "DP group of 1 is [1,3]");
  check(grid.group_of(1, hybrid::Axis::PP) == std::vector<int>({1, 5}), "PP group of 1 is [1,5]");
  check(grid.model_parallel_group_of(7) == std::vector<int>({2, 3, 6, 7}), "model-parallel group of 7");
  check(grid.pp_next(2) == 6 && grid.pp_prev(2) == -1, "pipeline neighbours of rank 2");
  check(throws([] { hybrid::ProcessGrid(0, 1, 1); }), "dp=0 is rejected");
  check(grid.order() == "mp-dp-pp" && grid.stride(hybrid::Axis::TP) == 1, "the default order, tp adjacent");
}

void test_grid_with_a_cp_axis() {
  // process_grid.h's second example: dp=2 pp=2 tp=2 cp=2, order "mp-dp-pp", so cp sits right after tp.
  using hybrid::Axis;
  hybrid::ProcessGrid grid(2, 2, 2, "mp-dp-pp", /*cp=*/2);
  check(grid.world_size() == 16 && grid.order() == "mp-cp-dp-pp", "cp shows in the order: " + grid.order());
  const hybrid::GridCoord c = grid.coords(11);  // 11 = 1 + 2 * 1 + 4 * 0 + 8 * 1
  check(c.mp == 1 && c.cp == 1 && c.dp == 0 && c.pp == 1, "rank 11 is (tp1, cp1, dp0, pp1)");
  check(grid.group_of(0, Axis::CP) == std::vector<int>({0, 2}), "CP group of 0 is [0,2]");
  check(grid.group_of(0, Axis::DP) == std::vector<int>({0, 4}), "DP group of 0 is [0,4]");
  check(grid.group_of(2, {Axis::DP, Axis::CP}) == std::vector<int>({0, 4, 2, 6}), "DP x CP group of 2, dp fastest");
  check(grid.groups({Axis::DP, Axis::CP}).size() == 4, "four DP x CP groups");
  check(grid.model_parallel_group_of(0) == std::vector<int>({0, 1, 8, 9}), "model-parallel group of 0 is PP x TP");
  // With cp = 1 the layout is the three-axis grid's, whatever the order.
  for (const char* order : {"mp-dp-pp", "dp-pp-tp", "pp-mp-dp", "cp-dp-pp-mp"}) {
    hybrid::ProcessGrid three(2, 3, 2, order), with_cp(2, 3, 2, order, 1);
    for (int r = 0; r < 12; ++r) check(three.coords(r) == with_cp.coords(r), std::string("cp=1 keeps ") + order);
  }
  check(hybrid::ProcessGrid(1, 1, 1, "tp-dp-pp").order() == "tp-dp-pp", "tp keeps its spelling");
  check(throws([] { hybrid::ProcessGrid(1, 1, 1, "mp-dp"); }), "an order without pp is refused");
  check(throws([] { hybrid::ProcessGrid(1, 1, 1, "mp-dp-pp", 0); }), "cp=0 is refused");
}

void test_action_round_trip() {
  for (const char* text : {"1F3", "0SEND_B2", "12RECV_F7", "3W0", "0I10"}) {
    check(hybrid::to_string(hybrid::parse_action(text)) == text, std::string("round trip of ") + text);
  }
  const hybrid::Action a = hybrid::parse_action("0SEND_B2");
  check(a.stage == 0 && a.type == hybrid::ActionType::SEND_B && a.micro == 2, "0SEND_B2 fields");
  check(throws([] { hybrid::parse_action("F3"); }), "no stage is rejected");
  check(throws([] { hybrid::parse_action("1X3"); }), "unknown type is rejected");
}

void test_1f1b_bubble() {
  const hybrid::Schedule s = hybrid::make_schedule("1f1b", 4, 8, 1);
  hybrid::validate(s, hybrid::StagePlacement(4, 4), 8);
  const hybrid::SimResult r = hybrid::simulate(s, hybrid::StagePlacement(4, 4), hybrid::Costs());
  check(std::fabs(r.bubble - 3.0 / 11.0) < 1e-12, "1f1b p=4 m=8 bubble is 3/11");
  check(r.makespan == 33.0, "1f1b p=4 m=8 makespan is 33 with F=1 B=2");
  check(r.peak_activations == std::vector<int>({4, 3, 2, 1}), "1f1b peak activations 4 3 2 1");
}

void test_every_schedule_runs() {
  // The full sweep of the acceptance criteria, at C++ speed.
  int count = 0;
  for (int pp = 1; pp <= 8; ++pp) {
    for (int m = 1; m <= 32; ++m) {
      for (int v = 1; v <= 4; ++v) {
        for (const std::string& name : hybrid::schedule_names()) {
          if (throws([&] { hybrid::check_schedule_request(name, pp, m, v); })) continue;
          const std::string what = name + " pp=" + std::to_string(pp) + " m=" + std::to_string(m) +
                                   " v=" + std::to_string(v);
          try {
            const hybrid::Schedule s = hybrid::make_schedule(name, pp, m, v);
            const hybrid::StagePlacement placement = hybrid::schedule_stage_placement(name, pp, v);
            hybrid::validate(s, placement, m);
            const hybrid::SimResult r = hybrid::simulate(s, placement, hybrid::Costs());
            int peak = 0;
            for (int p : r.peak_activations) peak = std::max(peak, p);
            check(peak == hybrid::activation_bound(name, pp, m, v), what + ": peak activations " +
                                                                       std::to_string(peak) + " off the bound");
            ++count;
          } catch (const std::exception& e) {
            check(false, what + ": " + e.what());
          }
        }
      }
    }
  }
  check(count > 1500, "the sweep covered the legal requests");
}

void test_loop_placement() {
  using hybrid::Placement;
  // Stage s on rank s mod pp, for several pp and v; each rank's stages ascend by pp.
  for (int pp = 1; pp <= 5; ++pp) {
    for (int v = 1; v <= 4; ++v) {
      const std::string what = "loop pp=" + std::to_string(pp) + " v=" + std::to_string(v);
      for (int s = 0; s < pp * v; ++s) {
        check(hybrid::stage_rank(s, pp, pp * v, Placement::Loop) == s % pp, what + ": stage " + std::to_string(s));
      }
      for (int r = 0; r < pp; ++r) {
        std::vector<int> expected;
        for (int c = 0; c < v; ++c) expected.push_back(r + c * pp);
        check(hybrid::rank_stages(r, pp, pp * v, Placement::Loop) == expected, what + ": stages of rank " +
                                                                                    std::to_string(r));
      }
      const hybrid::StagePlacement placement(pp, pp * v);
      check(placement.first_rank() == 0 && placement.last_rank() == pp - 1, what + ": first and last rank");
    }
  }
  // pp=3 v=2, the worked example of placement.h.
  const hybrid::StagePlacement loop(3, 6);
  std::vector<int> ranks;
  for (int s = 0; s < 6; ++s) ranks.push_back(loop.rank_of(s));
  check(ranks == std::vector<int>({0, 1, 2, 0, 1, 2}), "loop pp=3: 0 1 2 0 1 2");
  check(!loop.local_handoff(2) && hybrid::StagePlacement(1, 3).local_handoff(0), "loop hand-offs: pp=1 stays local");
  check(throws([] { hybrid::stage_rank(6, 3, 6, hybrid::Placement::Loop); }), "loop: stage 6 of 6 is refused");
  check(throws([] { hybrid::StagePlacement(3, 4); }), "loop: 4 stages on 3 ranks are refused");
  check(throws([] { hybrid::StagePlacement(0, 0); }), "loop: pp=0 is refused");
}

void test_v_placement() {
  using hybrid::Placement;
  // pp=3: stages 0 1 2 3 4 5 on ranks 0 1 2 2 1 0 (placement.h's worked example).
  const hybrid::StagePlacement v3(3, 6, Placement::V);
  std::vector<int> ranks;
  for (int s = 0; s < 6; ++s) ranks.push_back(v3.rank_of(s));
  check(ranks == std::vector<int>({0, 1, 2, 2, 1, 0}), "v pp=3: 0 1 2 2 1 0");
  check(v3.first_rank() == 0 && v3.last_rank() == 0, "v: the first and the last stage are both on rank 0");
  check(v3.local_handoff(2) && !v3.local_handoff(1) && !v3.local_handoff(3), "v pp=3: only 2 -> 3 stays local");
  for (int pp = 1; pp <= 6; ++pp) {
    const std::string what = "v pp=" + std::to_string(pp);
    for (int r = 0; r < pp; ++r) {
      check(hybrid::rank_stages(r, pp, 2 * pp, Placement::V) == std::vector<int>({r, 2 * pp - 1 - r}),
            what + ": rank " + std::to_string(r) + " holds stages r and 2 pp - 1 - r");
    }
    for (int s = 0; s < 2 * pp; ++s) {
      const int r = hybrid::stage_rank(s, pp, 2 * pp, Placement::V);
      check(r == hybrid::stage_rank(2 * pp - 1 - s, pp, 2 * pp, Placement::V), what + ": mirror of stage " +
                                                                                  std::to_string(s));
      check(r == (s < pp ? s : 2 * pp - 1 - s), what + ": stage " + std::to_string(s));
    }
  }
  for (int stages : {2, 3, 6, 8}) {
    check(throws([stages] { hybrid::StagePlacement(2, stages, Placement::V); }),
          "v with pp=2 refuses " + std::to_string(stages) + " stages");
  }
  check(!throws([] { hybrid::StagePlacement(2, 4, Placement::V); }), "v with pp=2 takes 4 stages");
  check(hybrid::parse_placement("v") == Placement::V && hybrid::to_string(Placement::Loop) == "loop" &&
            throws([] { hybrid::parse_placement("zigzag"); }),
        "placement names parse and print");
}

void test_v_lowering() {
  // A hand-made V program (pp=2, 4 stages, 2 micro-batches, all forwards then all backwards): lowering adds
  // no message for the hand-off 1 -> 2 on rank 1, and the program validates and simulates.
  using hybrid::Action;
  using hybrid::ActionType;
  const hybrid::StagePlacement v2(2, 4, hybrid::Placement::V);
  hybrid::Schedule compute(2);
  for (int r = 0; r < 2; ++r) {
    const std::vector<int> stages = v2.stages_of(r);
    for (int s : stages) {
      for (int k = 0; k < 2; ++k) compute[r].push_back({s, ActionType::F, k});
    }
    for (auto s = stages.rbegin(); s != stages.rend(); ++s) {
      for (int k = 0; k < 2; ++k) compute[r].push_back({*s, ActionType::B, k});
    }
  }
  const hybrid::Schedule lowered = hybrid::add_communication(compute, v2);
  int messages = 0;
  bool local_message = false;
  for (const auto& actions : lowered) {
    for (const Action& a : actions) {
      if (!hybrid::is_comm(a.type)) continue;
      ++messages;
      if ((a.type == ActionType::SEND_F && a.stage == 1) || (a.type == ActionType::RECV_F && a.stage == 2)) {
        local_message = true;
      }
    }
  }
  // Hops 0 -> 1 and 2 -> 3 cross ranks: per micro-batch a send and a receive each way, forward and backward.
  check(messages == 2 * 2 * 2 * 2, "v lowering: 16 messages, got " + std::to_string(messages));
  check(!local_message, "v lowering: no message for the local hand-off 1 -> 2");
  try {
    hybrid::validate(lowered, v2, 2);
    const hybrid::SimResult r = hybrid::simulate(lowered, v2, hybrid::Costs());
    check(r.makespan > 0, "v program simulates");
  } catch (const std::exception& e) {
    check(false, std::string("v program: ") + e.what());
  }
  check(throws([&] { hybrid::validate(lowered, hybrid::StagePlacement(2, 4), 2); }),
        "the v program is refused under the loop placement");
}

void test_v_schedules() {
  // zbv and dualpipev: v placement, every micro-batch F'd and backwarded once per stage, the split backwards'
  // W's all present, and a smaller bubble than 1f1b's and zb1's at equal stage costs (F = I = W = B / 2).
  using hybrid::ActionType;
  const int pp = 4, m = 8;
  const hybrid::StagePlacement one_chunk(pp, pp);
  const double bubble_1f1b = hybrid::simulate(hybrid::make_schedule("1f1b", pp, m), one_chunk).bubble;
  const double bubble_zb1 = hybrid::simulate(hybrid::make_schedule("zb1", pp, m), one_chunk).bubble;
  for (const std::string name : {"zbv", "dualpipev"}) {
    check(hybrid::schedule_placement(name) == hybrid::Placement::V, name + " runs the v placement");
    const hybrid::StagePlacement v(pp, 2 * pp, hybrid::Placement::V);
    const hybrid::Schedule s = hybrid::make_schedule(name, pp, m, 2);
    for (int r = 0; r < pp; ++r) {
      for (int stage : v.stages_of(r)) {
        int f = 0, b = 0, i = 0, w = 0;
        for (const hybrid::Action& a : s[r]) {
          if (a.stage != stage) continue;
          f += a.type == ActionType::F;
          b += a.type == ActionType::B;
          i += a.type == ActionType::I;
          w += a.type == ActionType::W;
        }
        const std::string what = name + " rank " + std::to_string(r) + " stage " + std::to_string(stage);
        check(f == m && b + i == m && w == i, what + ": F B I W counts");
        check(name != "zbv" || b == 0, what + ": zbv splits every backward");
      }
    }
    const hybrid::SimResult r = hybrid::simulate(s, v);
    check(r.bubble < bubble_zb1 && bubble_zb1 < bubble_1f1b,
          name + " bubble " + std::to_string(r.bubble) + " below zb1's " + std::to_string(bubble_zb1));
  }
  check(throws([] { hybrid::check_schedule_request("zbv", 4, 8, 1); }), "zbv refuses one chunk per rank");
  check(throws([] { hybrid::check_schedule_request("dualpipev", 4, 8, 3); }), "dualpipev refuses three chunks");
  check(throws([] { hybrid::check_schedule_request("dualpipev", 4, 7, 2); }), "dualpipev needs 2 pp micro-batches");
  check(throws([] { hybrid::check_schedule_request("zbv", 4, 8, 2, 1); }), "zbv takes no lookahead");
  check(hybrid::splits_backward("zbv") && !hybrid::splits_backward("dualpipev"), "only zbv's W's all merge");
  // The least counts are requests the schedule takes (what a count left to the planner is checked at).
  for (const std::string& name : hybrid::schedule_names()) {
    for (int pp = name == "interleaved" ? 2 : 1; pp <= 8; ++pp) {
      const int m = hybrid::least_micro_batches(name, pp), v = hybrid::least_virtual_stages(name);
      check(!throws([&] { hybrid::check_schedule_request(name, pp, m, v); }), name + ": its least counts");
      check(m == 1 || throws([&] { hybrid::check_schedule_request(name, pp, m - 1, v); }), name + ": m - 1 refused");
    }
  }
}

}  // namespace

int main() {
  test_grid_worked_example();
  test_grid_with_a_cp_axis();
  test_action_round_trip();
  test_1f1b_bubble();
  test_every_schedule_runs();
  test_loop_placement();
  test_v_placement();
  test_v_lowering();
  test_v_schedules();
  if (failures == 0) std::printf("all core checks passed\n");
  return failures == 0 ? 0 : 1;
}
