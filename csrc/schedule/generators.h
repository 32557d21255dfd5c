// Pipeline schedule generators. Torch-free.
//
// Each generator returns the compute-only program of every rank (F, B, I, W in execution order); the
// lowering pass (lower.h) adds the sends and receives. Stages are global virtual stage indices
// 0 .. pp * v - 1; which rank runs which is the schedule's placement (placement.h): loop (rank r owns stages
// r, r + pp, ..., r + (v - 1) * pp) for all but zbv and dualpipev, which run the v placement (rank r owns r and
// 2 pp - 1 - r).
//
//   naive        stop-and-wait, the course base code: micro-batch k + 1 enters only after k's backward left.
//   gpipe        all forwards, then all backwards (GPipe, arXiv 1811.06965); with v > 1 the same breadth-first
//                order over a rank's chunks (torch's ScheduleLoopedBFS).
//   1f1b         PipeDream-Flush (arXiv 2006.09503): warm-up, steady one-forward-one-backward, cool-down.
//   interleaved  Megatron's interleaved 1F1B over v chunks per rank (arXiv 2104.04473, section 2.2).
//   zb1          ZB-H1 (Qi et al., arXiv 2401.10241): 1F1B with B split into I and W, W deferred into the
//                cool-down bubbles.
//   dualpipev    DeepSeek's DualPipe folded onto a V (arXiv 2412.19437; torch's ScheduleDualPipeV): pairs of one
//                micro-batch's forward and another's backward, later backwards split (v_schedules.cpp).
//   zbv          ZB-V (arXiv 2401.10241, section 6): two chunks per rank in a V, I and W split, W's fill the
//                bubbles (v_schedules.cpp).
#pragma once

#include <string>
#include <vector>

#include "schedule/action.h"
#include "schedule/placement.h"

namespace hybrid {

// The names make_schedule accepts, in order of decreasing bubble.
const std::vector<std::string>& schedule_names();
void check_schedule_name(const std::string& name);  // throws std::invalid_argument naming the unknown schedule

// Whether the named schedule splits every backward into I and W (zb1, zbv): only then may the W actions of a
// stage be merged into one (--merge-wgrad). dualpipev splits some backwards and runs the rest whole.
bool splits_backward(const std::string& name);

// The fewest model chunks per rank a schedule runs: 2 for interleaved (it interleaves chunks) and for the V
// schedules (exactly 2: one per arm of the V), else 1.
int least_virtual_stages(const std::string& name);

// The fewest micro-batches a schedule takes on pp ranks: 2 pp for dualpipev, pp for interleaved (a multiple of
// pp), else 1. A count left to the planner is checked at this value, so only what the user fixed is refused.
int least_micro_batches(const std::string& name, int pp);

// Throws std::invalid_argument with one clear sentence if (name, pp, micro_batches, virtual_stages) is not a
// schedule we can build: sizes < 1, an unknown name, v > 1 for a one-chunk schedule, interleaved with v < 2,
// pp < 2 or micro_batches not a multiple of pp, zbv or dualpipev with v != 2, dualpipev with fewer than 2 pp
// micro-batches, a negative lookahead, one for a schedule other than 1f1b/zb1 or one beyond the micro-batches.
void check_schedule_request(const std::string& name, int pp, int micro_batches, int virtual_stages,
                            int lookahead = 0);
// The part of it that holds for any schedule: no more lookahead forwards than the step has micro-batches.
void check_lookahead(int micro_batches, int lookahead);

// The most micro-batch activations of one stage chunk that any rank holds at once under the named schedule
// (after check_schedule_request): what simulate's peak_activations reaches, and the memory bound validation
// checks. An activation is live from its F to its B, or to its W when the backward is split.
//   naive 1; gpipe m v; 1f1b and zb1 min(m, pp + lookahead) (the last rank takes no lookahead);
//   interleaved min(m v, 2 (pp - 1) + (v - 1) pp + 1); zbv min(2 m, 2 pp); dualpipev 2 pp + 1.
// A V chunk is half a one-chunk stage, so zbv holds 1f1b's memory and dualpipev one half-stage more.
int activation_bound(const std::string& name, int pp, int micro_batches, int virtual_stages = 1, int lookahead = 0);

Schedule naive_compute(int pp, int micro_batches);
Schedule gpipe_compute(int pp, int micro_batches, int virtual_stages = 1);
// lookahead: forwards each rank but the last runs beyond 1F1B's warm-up (generators.cpp says why).
Schedule one_f_one_b_compute(int pp, int micro_batches, int lookahead = 0);
Schedule interleaved_compute(int pp, int micro_batches, int virtual_stages);
Schedule zb1_compute(int pp, int micro_batches, int lookahead = 0);
Schedule zbv_compute(int pp, int micro_batches);        // v placement, 2 pp stages
Schedule dualpipev_compute(int pp, int micro_batches);  // v placement, 2 pp stages, micro_batches >= 2 pp

// Where a named schedule puts its stages (what lowering, validation, simulation and the executor are told).
Placement schedule_placement(const std::string& name);

// The placement of a request check_schedule_request accepts: pp ranks, pp * virtual_stages stages.
StagePlacement schedule_stage_placement(const std::string& name, int pp, int virtual_stages);

// Compute-only program of a named schedule, after check_schedule_request.
Schedule make_compute_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages = 1,
                               int lookahead = 0);

// The program each rank executes: make_compute_schedule lowered by add_communication.
Schedule make_schedule(const std::string& name, int pp, int micro_batches, int virtual_stages = 1,
                       int lookahead = 0);

}  // namespace hybrid
