// Stage placement: which pipeline rank runs each (virtual) stage. Torch-free.
//
// This is the one place that maps a stage to a rank. The generators, the lowering, the validator, the
// simulator, the executor and the Python side (through _C.schedule.stage_rank / rank_stages) all ask it, so a
// schedule with another placement changes only its generator.
//
//   loop  stage s on rank s mod pp: with v stages per rank, rank r holds r, r + pp, ..., r + (v - 1) pp
//         (GPipe, 1F1B, Megatron's interleaved 1F1B, ZB-H1). Neighbouring stages are on neighbouring ranks,
//         and the last rank hands stage k pp - 1 on to rank 0 for stage k pp.
//   v     two stages per rank in a V: stage s and 2 pp - 1 - s on one rank, so rank r holds r and
//         2 pp - 1 - r (ZBV, DualPipeV). The first and last stage both sit on rank 0, and stages pp - 1 and pp
//         are both on rank pp - 1: that hand-off stays on the rank.
//
// Worked example, pp = 3, 6 stages:
//   stage:  0 1 2 3 4 5
//   loop:   0 1 2 0 1 2
//   v:      0 1 2 2 1 0
#pragma once

#include <string>
#include <vector>

namespace hybrid {

enum class Placement { Loop, V };

std::string to_string(Placement placement);          // "loop" | "v"
Placement parse_placement(const std::string& text);  // throws std::invalid_argument naming the text
const std::vector<std::string>& placement_names();

// Throws std::invalid_argument with one sentence unless pp >= 1, num_stages is a positive multiple of pp and,
// for v, num_stages == 2 pp.
void check_placement(int pp, int num_stages, Placement placement);

// The pipeline rank that runs `stage` (0 .. num_stages - 1). Throws std::invalid_argument for a stage out of
// range or a placement check_placement refuses.
int stage_rank(int stage, int pp, int num_stages, Placement placement);

// The stages `rank` runs, ascending (the order its chunks sit in the model).
std::vector<int> rank_stages(int rank, int pp, int num_stages, Placement placement);

// One pipeline's placement, checked once: what the schedule passes take instead of (pp, num_stages).
struct StagePlacement {
  int pp = 1;
  int num_stages = 1;
  Placement kind = Placement::Loop;

  StagePlacement(int pp, int num_stages, Placement kind = Placement::Loop);  // check_placement
  int rank_of(int stage) const;
  std::vector<int> stages_of(int rank) const { return rank_stages(rank, pp, num_stages, kind); }
  int first_rank() const { return rank_of(0); }              // holds the first stage (takes the inputs)
  int last_rank() const { return rank_of(num_stages - 1); }  // holds the last stage (computes the loss)
  // Whether stage s hands its output to stage s + 1 on the same rank (no send or receive).
  bool local_handoff(int stage) const { return rank_of(stage) == rank_of(stage + 1); }
};

}  // namespace hybrid
