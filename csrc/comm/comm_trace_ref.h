// A CommTrace as a TorchScript custom class (torch.classes.hybrid.CommTrace), so that a custom operator's schema
// can take one (tp/ops.cpp). The engine's trace stays one shared object: this only holds a reference to it.
#pragma once

#include <ATen/core/ivalue.h>

#include <memory>
#include <utility>

#include "comm/comm_trace.h"

namespace hybrid {

struct CommTraceRef : torch::CustomClassHolder {
  explicit CommTraceRef(std::shared_ptr<CommTrace> shared) : trace(std::move(shared)) {}
  std::shared_ptr<CommTrace> trace;
};

}  // namespace hybrid
