// ProcessGrid: where each rank sits in a mesh of named axes. Torch-free.
//
// Axes: dp (data parallel), cp (context parallel), pp (pipeline), tp (tensor parallel; "mp" is its other name,
// the course's --mp) and ep (expert parallel). An axis not given has size 1 and changes no rank.
//
// Ranks are laid out by an order string naming axes from fastest- to slowest-varying, e.g. "mp-dp-pp" (the
// default): tensor-parallel peers are adjacent ranks (so they share a node and its NVLink), and pipeline stages
// are outermost. The order names dp, pp and tp (or mp) once each, and may name cp and ep; an axis it leaves out
// goes right after the axis before it in the full default order tp-cp-ep-dp-pp (cp after tp, ep after cp). So
// "mp-dp-pp" with a cp axis is "mp-cp-dp-pp": context-parallel peers next to each other, inside one replica.
// With cp = ep = 1 every order lays ranks out as it names them.
//
//   rank = sum over axes of coordinate * stride,   stride(axis) = product of the sizes of the faster axes
//
// Worked example, dp=2 pp=2 tp=2, order "mp-dp-pp":
//   rank: 0 1 2 3 4 5 6 7
//   tp:   0 1 0 1 0 1 0 1
//   dp:   0 0 1 1 0 0 1 1
//   pp:   0 0 0 0 1 1 1 1
//   TP groups [0,1] [2,3] [4,5] [6,7]; DP groups [0,2] [1,3] [4,6] [5,7]; PP groups [0,4] [1,5] [2,6] [3,7];
//   model-parallel groups (one replica's PP x TP ranks) [0,1,4,5] [2,3,6,7].
// The same with cp=2 (order "mp-dp-pp", so cp sits after tp: "mp-cp-dp-pp"), 16 ranks:
//   tp: rank mod 2; cp: (rank / 2) mod 2; dp: (rank / 4) mod 2; pp: rank / 8
//   CP groups [0,2] [1,3] ...; DP groups [0,4] [1,5] ...; DP x CP groups (where gradients reduce) hold
//   {0,2,4,6} {1,3,5,7} {8,10,12,14} {9,11,13,15}.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace hybrid {

enum class Axis { DP = 0, CP = 1, PP = 2, TP = 3, EP = 4, MP = TP };
constexpr int kNumAxes = 5;
constexpr std::array<Axis, kNumAxes> kAxes = {Axis::DP, Axis::CP, Axis::PP, Axis::TP, Axis::EP};

const char* axis_name(Axis axis);          // "dp", "cp", "pp", "tp", "ep"
Axis parse_axis(const std::string& name);  // also "mp" for tp; throws std::invalid_argument naming the bad axis

struct GridCoord {
  int dp = 0;
  int pp = 0;
  int mp = 0;  // the tp coordinate
  int cp = 0;
  int ep = 0;
  int get(Axis axis) const;
  void set(Axis axis, int value);
  bool operator==(const GridCoord& o) const {
    return dp == o.dp && pp == o.pp && mp == o.mp && cp == o.cp && ep == o.ep;
  }
};

// The sizes of every axis; each defaults to 1.
struct AxisSizes {
  std::array<int, kNumAxes> size{1, 1, 1, 1, 1};
  int& operator[](Axis axis) { return size[static_cast<int>(axis)]; }
  int operator[](Axis axis) const { return size[static_cast<int>(axis)]; }
};

class ProcessGrid {
 public:
  static constexpr const char* kDefaultOrder = "mp-dp-pp";

  // Throws std::invalid_argument naming the axis for a size < 1 ("--cp must be >= 1, got 0") or a malformed order
  // (an unknown or repeated axis).
  ProcessGrid(int dp, int pp, int mp, const std::string& order = kDefaultOrder, int cp = 1, int ep = 1);
  ProcessGrid(const AxisSizes& sizes, const std::string& order = kDefaultOrder);

  int dp_size() const { return size(Axis::DP); }
  int pp_size() const { return size(Axis::PP); }
  int mp_size() const { return size(Axis::TP); }
  int cp_size() const { return size(Axis::CP); }
  int ep_size() const { return size(Axis::EP); }
  int size(Axis axis) const { return sizes_[axis]; }
  int world_size() const;
  // The order as named (the axes the user's order names, and any other of size > 1, fastest first; tp spelled
  // the way the order spelled it, "mp" by default).
  const std::string& order() const { return order_; }
  // Every axis, fastest- to slowest-varying.
  const std::array<Axis, kNumAxes>& axes() const { return axes_; }
  int stride(Axis axis) const { return strides_[static_cast<int>(axis)]; }

  // Throws std::invalid_argument "grid dp x pp x mp = 3 x 2 x 2 = 12 != world size 8" on a mismatch (cp and ep
  // are named when > 1).
  void check_world_size(int world_size) const;

  GridCoord coords(int rank) const;
  int rank_of(const GridCoord& coord) const;

  // All groups along a set of axes: each inner list holds the ranks that differ only in those axes' coordinates,
  // ordered by those coordinates with the first axis listed fastest (so along one axis a rank's index in its group
  // is its coordinate). Groups are listed by increasing smallest member; every rank is in exactly one group.
  std::vector<std::vector<int>> groups(const std::vector<Axis>& axes) const;
  std::vector<int> group_of(int rank, const std::vector<Axis>& axes) const;
  std::vector<std::vector<int>> groups(Axis axis) const { return groups(std::vector<Axis>{axis}); }
  std::vector<int> group_of(int rank, Axis axis) const { return group_of(rank, std::vector<Axis>{axis}); }

  // The model-parallel group of a replica: the PP x TP ranks that share every other coordinate, ascending.
  std::vector<std::vector<int>> model_parallel_groups() const;
  std::vector<int> model_parallel_group_of(int rank) const;

  // Pipeline neighbours, or -1 at the ends.
  int pp_prev(int rank) const;
  int pp_next(int rank) const;

 private:
  void check_rank(int rank) const;
  AxisSizes sizes_;
  std::array<Axis, kNumAxes> axes_;  // fastest first
  std::array<int, kNumAxes> strides_;  // indexed by Axis
  std::string order_;
};

}  // namespace hybrid
