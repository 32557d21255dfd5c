#include "schedule/placement.h"

#include <stdexcept>

namespace hybrid {

namespace {

std::string sizes_text(int pp, int num_stages) {
  return "pp=" + std::to_string(pp) + ", stages=" + std::to_string(num_stages);
}

}  // namespace

std::string to_string(Placement placement) { return placement == Placement::V ? "v" : "loop"; }

const std::vector<std::string>& placement_names() {
  static const std::vector<std::string> names = {"loop", "v"};
  return names;
}

Placement parse_placement(const std::string& text) {
  if (text == "loop") return Placement::Loop;
  if (text == "v") return Placement::V;
  throw std::invalid_argument("unknown stage placement '" + text + "' (expected loop or v)");
}

void check_placement(int pp, int num_stages, Placement placement) {
  if (pp < 1) throw std::invalid_argument("pp must be >= 1 (got " + std::to_string(pp) + ")");
  if (num_stages < pp || num_stages % pp != 0) {
    throw std::invalid_argument("the number of stages must be a positive multiple of pp (got " +
                                sizes_text(pp, num_stages) + ")");
  }
  if (placement == Placement::V && num_stages != 2 * pp) {
    throw std::invalid_argument("the v placement puts exactly two stages on each rank, so it needs 2 x pp stages (got " +
                                sizes_text(pp, num_stages) + ")");
  }
}

int stage_rank(int stage, int pp, int num_stages, Placement placement) {
  check_placement(pp, num_stages, placement);
  if (stage < 0 || stage >= num_stages) {
    throw std::invalid_argument("stage " + std::to_string(stage) + " is outside 0.." +
                                std::to_string(num_stages - 1));
  }
  if (placement == Placement::V) return stage < pp ? stage : 2 * pp - 1 - stage;
  return stage % pp;
}

std::vector<int> rank_stages(int rank, int pp, int num_stages, Placement placement) {
  check_placement(pp, num_stages, placement);
  if (rank < 0 || rank >= pp) {
    throw std::invalid_argument("pipeline rank " + std::to_string(rank) + " is outside 0.." + std::to_string(pp - 1));
  }
  std::vector<int> stages;
  for (int s = 0; s < num_stages; ++s) {
    if (stage_rank(s, pp, num_stages, placement) == rank) stages.push_back(s);
  }
  return stages;
}

StagePlacement::StagePlacement(int pp, int num_stages, Placement kind) : pp(pp), num_stages(num_stages), kind(kind) {
  check_placement(pp, num_stages, kind);
}

int StagePlacement::rank_of(int stage) const { return stage_rank(stage, pp, num_stages, kind); }

}  // namespace hybrid
