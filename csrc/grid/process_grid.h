// ProcessGrid: where each rank sits in the DP x PP x MP grid. Torch-free.
//
// Ranks are laid out by an order string naming the axes from fastest- to slowest-varying. With the default
// "mp-dp-pp", model-parallel peers are adjacent ranks (so they share a node and its NVLink), and pipeline
// stages are outermost:
//
//   rank = mp_rank + mp_size * (dp_rank + dp_size * pp_rank)
//
// Worked example, dp=2 pp=2 mp=2, order "mp-dp-pp":
//   rank: 0 1 2 3 4 5 6 7
//   mp:   0 1 0 1 0 1 0 1
//   dp:   0 0 1 1 0 0 1 1
//   pp:   0 0 0 0 1 1 1 1
//   MP groups [0,1] [2,3] [4,5] [6,7]; DP groups [0,2] [1,3] [4,6] [5,7]; PP groups [0,4] [1,5] [2,6] [3,7];
//   model-parallel groups (one replica's PP x MP ranks) [0,1,4,5] [2,3,6,7].
#pragma once

#include <array>
#include <string>
#include <vector>

namespace hybrid {

enum class Axis { DP = 0, PP = 1, MP = 2 };

const char* axis_name(Axis axis);
Axis parse_axis(const std::string& name);  // throws std::invalid_argument naming the bad axis

struct GridCoord {
  int dp = 0;
  int pp = 0;
  int mp = 0;
  int get(Axis axis) const;
  bool operator==(const GridCoord& o) const { return dp == o.dp && pp == o.pp && mp == o.mp; }
};

class ProcessGrid {
 public:
  static constexpr const char* kDefaultOrder = "mp-dp-pp";

  // Throws std::invalid_argument (with the bad value named) for a size < 1 or a malformed order.
  ProcessGrid(int dp, int pp, int mp, const std::string& order = kDefaultOrder);

  int dp_size() const { return sizes_[0]; }
  int pp_size() const { return sizes_[1]; }
  int mp_size() const { return sizes_[2]; }
  int size(Axis axis) const { return sizes_[static_cast<int>(axis)]; }
  int world_size() const { return sizes_[0] * sizes_[1] * sizes_[2]; }
  const std::string& order() const { return order_; }
  // Axes from fastest- to slowest-varying.
  const std::array<Axis, 3>& axes() const { return axes_; }

  // Throws std::invalid_argument "dp x pp x mp = 3 x 2 x 2 = 12 != world size 8" on a mismatch.
  void check_world_size(int world_size) const;

  GridCoord coords(int rank) const;
  int rank_of(const GridCoord& coord) const;

  // All groups along an axis: each inner list holds the ranks that differ only in that axis's coordinate,
  // ordered by that coordinate (so a rank's index in its group is its coordinate). Groups are listed by
  // increasing smallest member; every rank appears in exactly one group per axis.
  std::vector<std::vector<int>> groups(Axis axis) const;
  std::vector<int> group_of(int rank, Axis axis) const;

  // The model-parallel group of a replica: the PP x MP ranks that share a dp coordinate, ascending.
  std::vector<std::vector<int>> model_parallel_groups() const;
  std::vector<int> model_parallel_group_of(int rank) const;

  // Pipeline neighbours, or -1 at the ends.
  int pp_prev(int rank) const;
  int pp_next(int rank) const;

 private:
  void check_rank(int rank) const;
  std::array<int, 3> sizes_;       // indexed by Axis
  std::array<Axis, 3> axes_;       // fastest first
  std::array<int, 3> strides_;     // indexed by Axis
  std::string order_;
};

}  // namespace hybrid
