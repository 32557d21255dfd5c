// The tensor-parallel layer functions as torch custom operators, namespace `hybrid` (torch.ops.hybrid.*, wrapped
// for Python in hybrid_engine/parallel/tensor/ops.py). Python reaches them through torch's dispatcher, as it
// reaches any torch operator, instead of through a pybind call of its own per layer; their backward is the C++
// autograd functions' (tp/*.h), so a backward runs no Python either.
//
// Kernels: the Autograd key runs the layer function itself (it builds its C++ autograd node); the CPU and CUDA
// keys (reached under inference mode, where autograd is off) run the same function, which then records nothing.
// What a schema cannot hold directly: the process group travels by its c10d name (resolved in c10d's registry,
// where torch.distributed.new_group puts every group), the GradBuffer by its address (0: none) and the CommTrace as a
// TorchScript custom class (torch.classes.hybrid.CommTrace). The address, not a custom class: turning a Python
// custom-class object into the dispatcher's argument costs about 7 us a call, three times the layer call itself,
// on every layer of every micro-batch; an integer costs nothing. Only parallel/tensor/ops.py passes it, from the
// GradBuffer the calling layer holds (alive for the call; the autograd node keeps its own reference after).
// A missing group (None) is the trivial group: the region functions return x.
// Under torch.compile the caller also passes its rank in the group: the graph traced through these kernels depends
// on it (this rank's slice of a gather's gradient), and torch caches compiled graphs by the traced program's
// arguments, across the processes of a machine.
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "comm/comm_trace_ref.h"
#include "grad/grad_buffer.h"
#include "tp/linear.h"
#include "tp/mp_region.h"
#include "tp/parallel_linear.h"
#include "tp/sequence_region.h"

namespace hybrid {

namespace {

using OptionalTrace = std::optional<c10::intrusive_ptr<CommTraceRef>>;
using OptionalGroupName = std::optional<c10::string_view>;

// rank: the caller's rank in the group where it names it (under torch.compile, so that the traced graph, which
// depends on it, is cached per rank), else -1.
GroupPtr group_named(const OptionalGroupName& name, int64_t rank) {
  if (!name.has_value()) return GroupPtr();
  GroupPtr group = c10d::resolve_process_group(std::string(name->data(), name->size()));
  TORCH_CHECK(rank < 0 || rank == group->getRank(), "hybrid operators: rank ", rank, " is not this process's rank ",
              group->getRank(), " in group ", group->getGroupName());
  return group;
}

// The GradBuffer at `address` (GradBuffer.address in Python), or none for 0.
GradBufferPtr buffer_at(int64_t address) {
  if (address == 0) return GradBufferPtr();
  return GradBufferPtr::unsafe_reclaim_from_nonowning(reinterpret_cast<GradBuffer*>(address));
}

std::shared_ptr<CommTrace> shared_trace(const OptionalTrace& trace) {
  return trace.has_value() && *trace ? (*trace)->trace : nullptr;
}

at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                     int64_t grads) {
  return linear(x, weight, bias, buffer_at(grads));
}

at::Tensor column_parallel_linear_op(const at::Tensor& x, const at::Tensor& weight,
                                     const std::optional<at::Tensor>& bias, int64_t grads,
                                     OptionalGroupName group, bool sequence_parallel, const OptionalTrace& trace,
                                     int64_t layer, int64_t rank) {
  return column_parallel_linear(x, weight, bias, buffer_at(grads), group_named(group, rank),
                                sequence_parallel, shared_trace(trace), layer);
}

at::Tensor row_parallel_linear_op(const at::Tensor& x, const at::Tensor& weight, int64_t grads,
                                  OptionalGroupName group, bool sequence_parallel, const OptionalTrace& trace,
                                  int64_t layer, int64_t rank) {
  return row_parallel_linear(x, weight, buffer_at(grads), group_named(group, rank), sequence_parallel,
                             shared_trace(trace), layer);
}

template <at::Tensor (*Region)(const at::Tensor&, const GroupPtr&)>
at::Tensor region_op(const at::Tensor& x, OptionalGroupName group, int64_t rank) {
  return Region(x, group_named(group, rank));
}

// Every kernel of the layer functions, for one dispatch key.
void register_kernels(torch::Library& m) {
  m.impl("linear", TORCH_FN(linear_op));
  m.impl("column_parallel_linear", TORCH_FN(column_parallel_linear_op));
  m.impl("row_parallel_linear", TORCH_FN(row_parallel_linear_op));
  m.impl("copy_to_mp_region", TORCH_FN(region_op<&copy_to_mp_region>));
  m.impl("reduce_from_mp_region", TORCH_FN(region_op<&reduce_from_mp_region>));
  m.impl("gather_from_mp_region", TORCH_FN(region_op<&gather_from_mp_region>));
  m.impl("gather_along_sequence", TORCH_FN(region_op<&gather_along_sequence>));
  m.impl("reduce_scatter_along_sequence", TORCH_FN(region_op<&reduce_scatter_along_sequence>));
  m.impl("scatter_along_sequence", TORCH_FN(region_op<&scatter_along_sequence>));
}

}  // namespace

TORCH_LIBRARY(hybrid, m) {
  m.class_<CommTraceRef>("CommTrace");
  const std::string grads = "int grads";
  const std::string trace = "__torch__.torch.classes.hybrid.CommTrace? trace=None";
  const std::string schemas[] = {
      "linear(Tensor x, Tensor weight, Tensor? bias=None, " + grads + "=0) -> Tensor",
      "column_parallel_linear(Tensor x, Tensor weight, Tensor? bias, " + grads +
          ", str? group, bool sequence_parallel=False, " + trace + ", int layer=0, int rank=-1) -> Tensor",
      "row_parallel_linear(Tensor x, Tensor weight, " + grads + ", str? group, bool sequence_parallel=False, " +
          trace + ", int layer=0, int rank=-1) -> Tensor",
  };
  for (const std::string& schema : schemas) m.def(schema.c_str());
  for (const char* region : {"copy_to_mp_region", "reduce_from_mp_region", "gather_from_mp_region",
                             "gather_along_sequence", "reduce_scatter_along_sequence", "scatter_along_sequence"}) {
    m.def((std::string(region) + "(Tensor x, str? group, int rank=-1) -> Tensor").c_str());
  }
  // Plain tensor reshuffles with no autograd of their own: one kernel for every key.
  m.def("sequence_to_slabs(Tensor x, int parts) -> Tensor", TORCH_FN(sequence_to_slabs));
  m.def("sequence_from_slabs(Tensor slabs) -> Tensor", TORCH_FN(sequence_from_slabs));
}

TORCH_LIBRARY_IMPL(hybrid, Autograd, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(hybrid, CPU, m) { register_kernels(m); }
TORCH_LIBRARY_IMPL(hybrid, CUDA, m) { register_kernels(m); }

}  // namespace hybrid
