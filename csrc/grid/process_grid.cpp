#include "grid/process_grid.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>

namespace hybrid {

const char* axis_name(Axis axis) {
  switch (axis) {
    case Axis::DP: return "dp";
    case Axis::PP: return "pp";
    case Axis::MP: return "mp";
  }
  return "?";
}

Axis parse_axis(const std::string& name) {
  if (name == "dp") return Axis::DP;
  if (name == "pp") return Axis::PP;
  if (name == "mp" || name == "tp") return Axis::MP;
  throw std::invalid_argument("unknown axis '" + name + "' in grid order (expected dp, pp and mp)");
}

int GridCoord::get(Axis axis) const {
  switch (axis) {
    case Axis::DP: return dp;
    case Axis::PP: return pp;
    case Axis::MP: return mp;
  }
  return 0;
}

namespace {

std::array<Axis, 3> parse_order(const std::string& order) {
  std::vector<std::string> names;
  std::string current;
  for (char c : order) {
    if (c == '-') {
      names.push_back(current);
      current.clear();
    } else {
      current += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  names.push_back(current);
  if (names.size() != 3) {
    throw std::invalid_argument("grid order '" + order +
                                "' must name dp, pp and mp once each, separated by '-' (e.g. mp-dp-pp)");
  }
  std::array<Axis, 3> axes{};
  std::array<bool, 3> seen{false, false, false};
  for (size_t i = 0; i < 3; ++i) {
    axes[i] = parse_axis(names[i]);
    int index = static_cast<int>(axes[i]);
    if (seen[index]) {
      throw std::invalid_argument("axis '" + std::string(axis_name(axes[i])) + "' is repeated in grid order '" +
                                  order + "'");
    }
    seen[index] = true;
  }
  return axes;
}

}  // namespace

ProcessGrid::ProcessGrid(int dp, int pp, int mp, const std::string& order) : sizes_{dp, pp, mp} {
  for (Axis axis : {Axis::DP, Axis::PP, Axis::MP}) {
    if (size(axis) < 1) {
      throw std::invalid_argument(std::string("--") + axis_name(axis) + " must be >= 1, got " +
                                  std::to_string(size(axis)));
    }
  }
  axes_ = parse_order(order);
  order_ = std::string(axis_name(axes_[0])) + "-" + axis_name(axes_[1]) + "-" + axis_name(axes_[2]);
  int stride = 1;
  for (Axis axis : axes_) {
    strides_[static_cast<int>(axis)] = stride;
    stride *= size(axis);
  }
}

void ProcessGrid::check_world_size(int world_size) const {
  if (world_size == this->world_size()) return;
  std::ostringstream msg;
  msg << "grid dp x pp x mp = " << dp_size() << " x " << pp_size() << " x " << mp_size() << " = "
      << this->world_size() << " != world size " << world_size;
  throw std::invalid_argument(msg.str());
}

void ProcessGrid::check_rank(int rank) const {
  if (rank < 0 || rank >= world_size()) {
    throw std::out_of_range("rank " + std::to_string(rank) + " outside grid of " + std::to_string(world_size()));
  }
}

GridCoord ProcessGrid::coords(int rank) const {
  check_rank(rank);
  GridCoord c;
  c.dp = (rank / strides_[0]) % dp_size();
  c.pp = (rank / strides_[1]) % pp_size();
  c.mp = (rank / strides_[2]) % mp_size();
  return c;
}

int ProcessGrid::rank_of(const GridCoord& coord) const {
  for (Axis axis : {Axis::DP, Axis::PP, Axis::MP}) {
    if (coord.get(axis) < 0 || coord.get(axis) >= size(axis)) {
      throw std::out_of_range(std::string(axis_name(axis)) + " coordinate " + std::to_string(coord.get(axis)) +
                              " outside size " + std::to_string(size(axis)));
    }
  }
  return coord.dp * strides_[0] + coord.pp * strides_[1] + coord.mp * strides_[2];
}

std::vector<int> ProcessGrid::group_of(int rank, Axis axis) const {
  GridCoord base = coords(rank);
  std::vector<int> members;
  members.reserve(size(axis));
  for (int i = 0; i < size(axis); ++i) {
    GridCoord c = base;
    if (axis == Axis::DP) c.dp = i;
    if (axis == Axis::PP) c.pp = i;
    if (axis == Axis::MP) c.mp = i;
    members.push_back(rank_of(c));
  }
  return members;
}

std::vector<std::vector<int>> ProcessGrid::groups(Axis axis) const {
  std::vector<std::vector<int>> result;
  for (int rank = 0; rank < world_size(); ++rank) {
    if (coords(rank).get(axis) == 0) result.push_back(group_of(rank, axis));
  }
  return result;  // ascending by smallest member, since rank ascends and coordinate 0 is smallest
}

std::vector<int> ProcessGrid::model_parallel_group_of(int rank) const {
  int dp = coords(rank).dp;
  std::vector<int> members;
  for (int r = 0; r < world_size(); ++r) {
    if (coords(r).dp == dp) members.push_back(r);
  }
  return members;
}

std::vector<std::vector<int>> ProcessGrid::model_parallel_groups() const {
  std::vector<std::vector<int>> result;
  for (int dp = 0; dp < dp_size(); ++dp) result.push_back(model_parallel_group_of(rank_of({dp, 0, 0})));
  std::sort(result.begin(), result.end());
  return result;
}

int ProcessGrid::pp_prev(int rank) const {
  GridCoord c = coords(rank);
  if (c.pp == 0) return -1;
  --c.pp;
  return rank_of(c);
}

int ProcessGrid::pp_next(int rank) const {
  GridCoord c = coords(rank);
  if (c.pp == pp_size() - 1) return -1;
  ++c.pp;
  return rank_of(c);
}

}  // namespace hybrid
