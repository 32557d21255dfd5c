// Global-norm gradient clipping over a DP x PP x MP grid.
//
// The global norm is the norm of the whole model's gradient, as one process holding all of it would
// compute it. Each rank passes its gradients in two lists:
//  - split: parameters sharded across the MP group (column/row-parallel weights, column-parallel biases);
//    each MP rank holds a different piece, so their squares are summed over the MP group;
//  - replicated: parameters every MP rank holds whole (row-parallel bias, layer norms, non-TP layers);
//    they are counted once, from MP rank 0, not mp_size times.
// Stage contributions are then summed over the PP group. DP replicas hold identical gradients after the
// DP all-reduce, so there is no DP reduction. Every rank of a replica ends with the same norm.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "comm/collectives.h"

namespace hybrid {

// Returns the pre-clip global L2 norm. When it is finite and above `max_norm`, scales every gradient (both
// lists) in place by max_norm / (norm + 1e-6). A non-finite norm clips nothing (the loss scaler skips that
// step); max_norm <= 0 only measures. Null groups mean size 1. Every rank of the MP and PP groups must call
// it, with or without gradients; `device` places the reduction when this rank has none. One host sync.
double clip_grad_norm(const std::vector<at::Tensor>& split_grads, const std::vector<at::Tensor>& replicated_grads,
                      double max_norm, const GroupPtr& mp_group, const GroupPtr& pp_group,
                      std::optional<at::Device> device = std::nullopt);

}  // namespace hybrid
