// Sequence parallelism's region boundaries as C++ autograd functions (Korthikanti et al. 2022,
// https://arxiv.org/abs/2205.05198): between tensor-parallel layers the activations are [b, s/p, ...], this
// rank's contiguous chunk of the sequence (dim 1).
//
//   gather_along_sequence          forward all-gather along dim 1,      backward reduce-scatter(sum) along dim 1
//   reduce_scatter_along_sequence  forward reduce-scatter(sum) on dim 1, backward all-gather along dim 1
//   scatter_along_sequence         forward this rank's chunk of dim 1,  backward all-gather along dim 1
//
// They are here rather than in Python because a GPT step calls them thousands of times: torch.distributed's
// Python wrappers cost ~250 us of host time per call, which set the pace of the step on GPUs; the ProcessGroup
// called directly (as mp_region does) costs a few.
//
// The collectives run on the slab layout [p, b, s/p, ...] (slab r is rank r's chunk), one flat collective each.
// On NCCL, Work::wait only makes the current stream wait: the host never blocks. Gloo has no reduce-scatter
// here (has_reduce_scatter): it all-reduces the whole tensor and keeps this rank's chunk.
//
// A trivial group (null or of size 1) makes all three the identity: they return `x` itself and add no graph node.
// All members of the group must call them in the same order, with the same shapes.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "comm/collectives.h"

namespace hybrid {

// [b, s/p, ...] on every rank -> [b, s, ...], the chunks in rank order.
at::Tensor gather_along_sequence(const at::Tensor& x, const GroupPtr& group);
// [b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum. s must divide by the group size.
at::Tensor reduce_scatter_along_sequence(const at::Tensor& x, const GroupPtr& group);
// [b, s, ...] replicated over the group -> this rank's chunk [b, s/p, ...]. s must divide by the group size.
at::Tensor scatter_along_sequence(const at::Tensor& x, const GroupPtr& group);

// A collective in flight whose result needs a last step once it is done (a chunk narrowed out, slabs reordered).
struct PendingCollective {
  c10::intrusive_ptr<c10d::Work> work;  // null: nothing in flight
  std::function<at::Tensor()> result;
  // On a device the current stream waits for the collective (the host runs on); on the CPU the host waits.
  at::Tensor wait() {
    if (work) work->wait();
    return result();
  }
};
// The same collectives as the autograd functions above, started and not waited for (a trivial group: the input).
PendingCollective all_gather_seq_async(const at::Tensor& x, const GroupPtr& group);
PendingCollective reduce_scatter_seq_async(const at::Tensor& x, const GroupPtr& group);

// [b, s, ...] -> [p, b, s/p, ...], contiguous (one copy): rank r's sequence chunk is the r-th slab.
at::Tensor sequence_to_slabs(const at::Tensor& x, int64_t parts);
// [p, b, s/p, ...] -> [b, s, ...], the inverse of sequence_to_slabs (a view when b == 1, else one copy).
at::Tensor sequence_from_slabs(const at::Tensor& slabs);

}  // namespace hybrid
