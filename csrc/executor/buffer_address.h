// The start address of a tensor's storage view, as the DP grad sync and the parameter gather key their
// buckets: a gradient or parameter is located in its bucket by where its bytes begin.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hybrid {

inline uintptr_t buffer_address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()); }

}  // namespace hybrid
