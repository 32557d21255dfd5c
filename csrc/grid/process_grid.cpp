#include "grid/process_grid.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <stdexcept>

namespace hybrid {

namespace {

// The full default order, fastest first: where an axis a user's order leaves out goes (process_grid.h).
constexpr std::array<Axis, kNumAxes> kDefaultFullOrder = {Axis::TP, Axis::CP, Axis::EP, Axis::DP, Axis::PP};

constexpr const char* kAxisNames[kNumAxes] = {"dp", "cp", "pp", "tp", "ep"};

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> names(1);
  for (char c : order) {
    if (c == '-') {
      names.emplace_back();
    } else {
      names.back() += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
  }
  return names;
}

struct ParsedOrder {
  std::array<Axis, kNumAxes> axes;  // every axis, fastest first
  std::vector<Axis> named;          // the axes the order names, in its order
  std::string tp_spelling = "mp";
};

std::invalid_argument must_name(const std::string& order, const std::string& why = "") {
  return std::invalid_argument(why + "grid order '" + order + "' must name dp, pp and mp once each, separated by '-' "
                               "(e.g. mp-dp-pp; cp and ep may be named too, else they follow mp)");
}

ParsedOrder parse_order(const std::string& order) {
  ParsedOrder parsed;
  std::array<bool, kNumAxes> seen{};
  const std::vector<std::string> names = split_order(order);
  if (names.size() < 3) throw must_name(order);
  for (const std::string& name : names) {
    if (name.empty()) throw must_name(order, "an axis name is empty: ");
    const Axis axis = parse_axis(name);
    if (seen[static_cast<int>(axis)]) {
      throw must_name(order, "axis '" + std::string(axis_name(axis)) + "' is repeated: ");
    }
    seen[static_cast<int>(axis)] = true;
    if (axis == Axis::TP) parsed.tp_spelling = name;
    parsed.named.push_back(axis);
  }
  for (Axis axis : {Axis::DP, Axis::PP, Axis::TP}) {
    if (!seen[static_cast<int>(axis)]) {
      throw must_name(order, std::string("axis '") + (axis == Axis::TP ? "mp" : axis_name(axis)) + "' is missing: ");
    }
  }
  // Each axis left out (cp, ep) goes right after the one before it in the full default order; walking the
  // default order places every predecessor first.
  std::vector<Axis> full = parsed.named;
  for (size_t i = 0; i < kDefaultFullOrder.size(); ++i) {
    const Axis axis = kDefaultFullOrder[i];
    if (std::find(full.begin(), full.end(), axis) != full.end()) continue;
    auto at = full.begin();
    if (i > 0) {
      auto before = std::find(full.begin(), full.end(), kDefaultFullOrder[i - 1]);
      if (before != full.end()) at = before + 1;
    }
    full.insert(at, axis);
  }
  std::copy(full.begin(), full.end(), parsed.axes.begin());
  return parsed;
}

}  // namespace

const char* axis_name(Axis axis) { return kAxisNames[static_cast<int>(axis)]; }

Axis parse_axis(const std::string& name) {
  if (name == "mp") return Axis::TP;
  for (Axis axis : kAxes) {
    if (name == axis_name(axis)) return axis;
  }
  throw std::invalid_argument("unknown axis '" + name + "' in grid order (expected dp, cp, pp, tp (or mp) and ep)");
}

int GridCoord::get(Axis axis) const {
  switch (axis) {
    case Axis::DP: return dp;
    case Axis::CP: return cp;
    case Axis::PP: return pp;
    case Axis::TP: return mp;
    case Axis::EP: return ep;
  }
  return 0;
}

void GridCoord::set(Axis axis, int value) {
  switch (axis) {
    case Axis::DP: dp = value; break;
    case Axis::CP: cp = value; break;
    case Axis::PP: pp = value; break;
    case Axis::TP: mp = value; break;
    case Axis::EP: ep = value; break;
  }
}

ProcessGrid::ProcessGrid(int dp, int pp, int mp, const std::string& order, int cp, int ep)
    : ProcessGrid(
          [&] {
            AxisSizes sizes;
            sizes[Axis::DP] = dp;
            sizes[Axis::PP] = pp;
            sizes[Axis::TP] = mp;
            sizes[Axis::CP] = cp;
            sizes[Axis::EP] = ep;
            return sizes;
          }(),
          order) {}

ProcessGrid::ProcessGrid(const AxisSizes& sizes, const std::string& order) : sizes_(sizes) {
  // The course's flag names: --mp for the tp axis.
  for (Axis axis : {Axis::DP, Axis::PP, Axis::TP, Axis::CP, Axis::EP}) {
    if (size(axis) < 1) {
      throw std::invalid_argument(std::string("--") + (axis == Axis::TP ? "mp" : axis_name(axis)) +
                                  " must be >= 1, got " + std::to_string(size(axis)));
    }
  }
  const ParsedOrder parsed = parse_order(order);
  axes_ = parsed.axes;
  for (Axis axis : axes_) {
    const bool named = std::find(parsed.named.begin(), parsed.named.end(), axis) != parsed.named.end();
    if (!named && size(axis) == 1) continue;
    if (!order_.empty()) order_ += "-";
    order_ += axis == Axis::TP ? parsed.tp_spelling : axis_name(axis);
  }
  long long stride = 1;
  for (Axis axis : axes_) {
    strides_[static_cast<int>(axis)] = static_cast<int>(stride);
    stride *= size(axis);
    if (stride > (1LL << 30)) throw std::invalid_argument("grid of more than 2^30 ranks");
  }
}

int ProcessGrid::world_size() const {
  int world = 1;
  for (Axis axis : kAxes) world *= size(axis);
  return world;
}

void ProcessGrid::check_world_size(int world_size) const {
  if (world_size == this->world_size()) return;
  // dp, pp and mp always (the course's grid), cp and ep when they take part.
  std::vector<Axis> shown;
  for (Axis axis : {Axis::DP, Axis::CP, Axis::PP, Axis::TP, Axis::EP}) {
    if (axis == Axis::DP || axis == Axis::PP || axis == Axis::TP || size(axis) > 1) shown.push_back(axis);
  }
  std::ostringstream msg;
  msg << "grid ";
  for (size_t i = 0; i < shown.size(); ++i) msg << (i ? " x " : "") << (shown[i] == Axis::TP ? "mp" : axis_name(shown[i]));
  msg << " = ";
  for (size_t i = 0; i < shown.size(); ++i) msg << (i ? " x " : "") << size(shown[i]);
  msg << " = " << this->world_size() << " != world size " << world_size;
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
  for (Axis axis : kAxes) c.set(axis, (rank / stride(axis)) % size(axis));
  return c;
}

int ProcessGrid::rank_of(const GridCoord& coord) const {
  int rank = 0;
  for (Axis axis : kAxes) {
    if (coord.get(axis) < 0 || coord.get(axis) >= size(axis)) {
      throw std::out_of_range(std::string(axis_name(axis)) + " coordinate " + std::to_string(coord.get(axis)) +
                              " outside size " + std::to_string(size(axis)));
    }
    rank += coord.get(axis) * stride(axis);
  }
  return rank;
}

std::vector<int> ProcessGrid::group_of(int rank, const std::vector<Axis>& axes) const {
  const GridCoord base = coords(rank);
  int members = 1;
  for (Axis axis : axes) members *= size(axis);
  std::vector<int> group;
  group.reserve(members);
  for (int index = 0; index < members; ++index) {
    GridCoord c = base;
    int rest = index;
    for (Axis axis : axes) {  // the first axis listed varies fastest
      c.set(axis, rest % size(axis));
      rest /= size(axis);
    }
    group.push_back(rank_of(c));
  }
  return group;
}

std::vector<std::vector<int>> ProcessGrid::groups(const std::vector<Axis>& axes) const {
  for (size_t i = 0; i < axes.size(); ++i) {
    if (std::find(axes.begin(), axes.begin() + i, axes[i]) != axes.begin() + i) {
      throw std::invalid_argument("axis '" + std::string(axis_name(axes[i])) + "' is listed twice in a group");
    }
  }
  std::vector<std::vector<int>> result;
  for (int rank = 0; rank < world_size(); ++rank) {
    const GridCoord c = coords(rank);
    if (std::all_of(axes.begin(), axes.end(), [&](Axis axis) { return c.get(axis) == 0; })) {
      result.push_back(group_of(rank, axes));
    }
  }
  return result;  // ascending by smallest member: rank ascends, and all-zero coordinates give the smallest
}

std::vector<int> ProcessGrid::model_parallel_group_of(int rank) const {
  std::vector<int> members = group_of(rank, {Axis::PP, Axis::TP});
  std::sort(members.begin(), members.end());
  return members;
}

std::vector<std::vector<int>> ProcessGrid::model_parallel_groups() const {
  std::vector<std::vector<int>> result = groups({Axis::PP, Axis::TP});
  for (auto& group : result) std::sort(group.begin(), group.end());
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
