#include "schedule/action.h"

#include <cctype>
#include <stdexcept>

namespace hybrid {

namespace {

struct TypeName {
  ActionType type;
  const char* name;
};

// One table for both directions, so printing and parsing cannot drift apart.
constexpr TypeName kTypeNames[] = {
    {ActionType::F, "F"},           {ActionType::B, "B"},           {ActionType::I, "I"},
    {ActionType::W, "W"},           {ActionType::SEND_F, "SEND_F"}, {ActionType::RECV_F, "RECV_F"},
    {ActionType::SEND_B, "SEND_B"}, {ActionType::RECV_B, "RECV_B"},
};

// Parses a run of decimal digits into a non-negative int, or returns -1 when it would not fit.
int parse_index(const std::string& digits) {
  long long value = 0;
  for (char c : digits) {
    value = value * 10 + (c - '0');
    if (value > 1000000000LL) return -1;
  }
  return static_cast<int>(value);
}

}  // namespace

std::string to_string(ActionType type) {
  for (const auto& entry : kTypeNames) {
    if (entry.type == type) return entry.name;
  }
  return "?";
}

ActionType parse_action_type(const std::string& text) {
  for (const auto& entry : kTypeNames) {
    if (text == entry.name) return entry.type;
  }
  throw std::invalid_argument("unknown action type '" + text +
                              "' (expected F, B, I, W, SEND_F, RECV_F, SEND_B or RECV_B)");
}

std::string to_string(const Action& action) {
  return std::to_string(action.stage) + to_string(action.type) + std::to_string(action.micro);
}

Action parse_action(const std::string& text) {
  // "<stage><type><micro>": every type name ends in a letter, so the leading and trailing digit runs are
  // unambiguous ("0SEND_B2" is stage 0, SEND_B, micro 2).
  auto is_digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  size_t head = 0;
  while (head < text.size() && is_digit(text[head])) ++head;
  size_t tail = text.size();
  while (tail > head && is_digit(text[tail - 1])) --tail;
  auto fail = [&](const std::string& why) {
    return std::invalid_argument("cannot parse action '" + text + "': " + why +
                                 " (expected <stage><type><micro-batch>, e.g. 1F3 or 0SEND_B2)");
  };
  if (head == 0) throw fail("no stage number at the start");
  if (head == text.size()) throw fail("no action type after the stage number");
  if (tail == text.size()) throw fail("no micro-batch number at the end");
  if (tail == head) throw fail("no action type between the numbers");
  Action action;
  action.stage = parse_index(text.substr(0, head));
  action.micro = parse_index(text.substr(tail));
  if (action.stage < 0 || action.micro < 0) throw fail("number too large");
  try {
    action.type = parse_action_type(text.substr(head, tail - head));
  } catch (const std::invalid_argument& e) {
    throw fail(e.what());
  }
  return action;
}

bool is_compute(ActionType type) {
  return type == ActionType::F || type == ActionType::B || type == ActionType::I || type == ActionType::W;
}

bool is_comm(ActionType type) { return !is_compute(type); }

}  // namespace hybrid
