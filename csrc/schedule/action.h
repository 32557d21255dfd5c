// One step of one rank's pipeline program. Torch-free.
//
// A schedule is data: for every pipeline rank an ordered list of actions. The executor runs the list
// literally, the simulator dry-runs all lists together, and the report draws them. An action prints as
// "<stage><type><micro>" (e.g. "1F3", "0SEND_B2") and parses back.
#pragma once

#include <string>
#include <vector>

namespace hybrid {

enum class ActionType {
  F,       // stage forward of one micro-batch
  B,       // full backward (input and weight gradients together)
  I,       // input-gradient half of the backward (zero-bubble)
  W,       // weight-gradient half of the backward, run later (zero-bubble)
  SEND_F,  // send this stage's output activation to the owner of stage + 1
  RECV_F,  // post the receive of this stage's input activation from the owner of stage - 1
  SEND_B,  // send the gradient of this stage's input to the owner of stage - 1
  RECV_B,  // post the receive of the gradient of this stage's output from the owner of stage + 1
};

struct Action {
  int stage = 0;  // global (virtual) stage index, 0 .. pp * v - 1
  ActionType type = ActionType::F;
  int micro = 0;  // micro-batch index, 0 .. m - 1

  bool operator==(const Action& o) const {
    return stage == o.stage && type == o.type && micro == o.micro;
  }
  bool operator!=(const Action& o) const { return !(*this == o); }
};

// One action list per pipeline rank.
using Schedule = std::vector<std::vector<Action>>;

std::string to_string(ActionType type);
ActionType parse_action_type(const std::string& text);  // throws std::invalid_argument
std::string to_string(const Action& action);            // "1F3"
Action parse_action(const std::string& text);           // throws std::invalid_argument naming the text

bool is_compute(ActionType type);  // F, B, I, W
bool is_comm(ActionType type);     // SEND_*, RECV_*

}  // namespace hybrid
