// Thin, blocking-where-it-says helpers over a c10d::ProcessGroup handed in from Python.
//
// A ProcessGroup arrives from Python as c10::intrusive_ptr<c10d::ProcessGroup> (torch's pybind11 holder
// caster does the conversion); ranks passed to send/recv are ranks *within that group*.
#pragma once

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <optional>
#include <vector>

namespace hybrid {

using GroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

// While torch traces a graph (torch.compile: dynamo's FakeTensors, AOTAutograd's functional tensors) a collective
// must be an operator of the graph that names its group: there, the helpers below call c10d's functional
// collectives (waited at once, the result assigned to the output argument; the work they return is null) instead
// of the ProcessGroup. Outside tracing they call the ProcessGroup directly, asynchronously where they say so.
bool is_traced(const at::Tensor& tensor);

// In-place sum over the group; waits for completion. A null group or a group of one is a no-op.
void all_reduce_sum(at::Tensor& tensor, const GroupPtr& group);

// In-place max over the group; waits.
void all_reduce_max(at::Tensor& tensor, const GroupPtr& group);

// Asynchronous in-place sum; the caller waits on the returned work (null for a trivial group).
c10::intrusive_ptr<c10d::Work> all_reduce_sum_async(at::Tensor& tensor, const GroupPtr& group);

// Asynchronous sum of `tensor` over the group into this member's equal piece of it (in place: the piece at
// rank * numel / size; the rest of `tensor` is left unspecified). numel must divide by the group size. Backends
// without a reduce-scatter (gloo) all-reduce the whole tensor instead: the piece holds the same sum.
c10::intrusive_ptr<c10d::Work> reduce_scatter_sum_async(at::Tensor& tensor, const GroupPtr& group);

// Asynchronous in-place all-gather: this member's equal piece of `tensor` (1-D, the piece at rank * numel / size)
// is written into every member's `tensor`; the caller waits on the returned work (null for a trivial group).
c10::intrusive_ptr<c10d::Work> all_gather_in_place_async(at::Tensor& tensor, const GroupPtr& group);

// Into `out` (size x in's elements, rank order), every member's `in`; asynchronous (the caller waits on the work).
c10::intrusive_ptr<c10d::Work> all_gather_into_async(at::Tensor& out, const at::Tensor& in, const GroupPtr& group);
// Into `out` (in's shape, its first dim divided by the group size), this member's piece of the sum of every member's
// `in` (split along its first dim); asynchronous. Needs a backend with a reduce-scatter (has_reduce_scatter).
c10::intrusive_ptr<c10d::Work> reduce_scatter_into_async(at::Tensor& out, const at::Tensor& in,
                                                          const GroupPtr& group);

// Whether the group's backend has a reduce-scatter (gloo has none: reduce_scatter_sum_async all-reduces there).
bool has_reduce_scatter(const GroupPtr& group);

// Every member's `tensor`, indexed by rank within the group; waits. All members must pass the same shape.
// A null group or a group of one returns {tensor}.
std::vector<at::Tensor> all_gather(const at::Tensor& tensor, const GroupPtr& group);

inline bool is_trivial(const GroupPtr& group) { return !group || group->getSize() == 1; }

// A group argument bound to Python: None (no such parallelism) arrives as nullopt and becomes the null group,
// which every helper here treats as trivial.
inline GroupPtr group_or_null(const std::optional<GroupPtr>& group) { return group.value_or(GroupPtr()); }

}  // namespace hybrid
