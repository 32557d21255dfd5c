// Megatron tensor-parallel region boundaries as C++ autograd functions (Shoeybi et al. 2019,
// https://arxiv.org/abs/1909.08053, section 3: the conjugate operators f and g).
//
//   copy_to_mp_region      "f": forward identity,                backward all-reduce(sum) over the MP group
//   reduce_from_mp_region  "g": forward all-reduce(sum),         backward identity
//   gather_from_mp_region      forward all-gather on last dim,   backward this rank's slice of the last dim
//
// A column-parallel Linear's input passes through copy_to (each rank's weight shard sees the full input, so the
// input gradient is the sum of the shards' contributions); a row-parallel Linear's partial output passes through
// reduce_from. One all-reduce per column/row pair forward, one backward.
//
// A trivial group (null or of size 1) makes all three the identity: they return `x` itself and add no graph node.
// All members of the group must call them in the same order (they are collectives, forward or backward).
#pragma once

#include <ATen/ATen.h>

#include "comm/collectives.h"

namespace hybrid {

at::Tensor copy_to_mp_region(const at::Tensor& x, const GroupPtr& group);
at::Tensor reduce_from_mp_region(const at::Tensor& x, const GroupPtr& group);
// Every rank's x must have the same shape; the result's last dim is group size times x's.
at::Tensor gather_from_mp_region(const at::Tensor& x, const GroupPtr& group);

}  // namespace hybrid
