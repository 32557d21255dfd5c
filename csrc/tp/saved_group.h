// Where the tensor-parallel autograd functions (mp_region, sequence_region) keep their process group between
// forward and backward: in saved_data, since c10d::ProcessGroup is a registered TorchScript custom class, so an
// IValue holds it (and keeps it alive for as long as the graph node lives).
#pragma once

#include <torch/csrc/autograd/custom_function.h>

#include "comm/collectives.h"

namespace hybrid {

inline void save_group(torch::autograd::AutogradContext* ctx, const GroupPtr& group) {
  ctx->saved_data["group"] = group;
}

inline GroupPtr saved_group(torch::autograd::AutogradContext* ctx) {
  return ctx->saved_data.at("group").toCustomClass<c10d::ProcessGroup>();
}

}  // namespace hybrid
