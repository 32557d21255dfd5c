// Torch-free core, tested alone: tests/cpp/test_cpp_core.py compiles this with csrc/grid/*.cpp and
// csrc/schedule/*.cpp using a plain C++17 compiler and no torch include path, then runs it.
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "grid/process_grid.h"
#include "schedule/action.h"
#include "schedule/generators.h"
#include "schedule/lower.h"
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
  hybrid::validate(s, 4, 4, 8);
  const hybrid::SimResult r = hybrid::simulate(s, 4, 4, hybrid::Costs());
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
            hybrid::validate(s, pp, pp * v, m);
            hybrid::simulate(s, pp, pp * v, hybrid::Costs());
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

}  // namespace

int main() {
  test_grid_worked_example();
  test_action_round_trip();
  test_1f1b_bubble();
  test_every_schedule_runs();
  if (failures == 0) std::printf("all core checks passed\n");
  return failures == 0 ? 0 : 1;
}
