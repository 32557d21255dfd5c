#include "tp/sequence_region.h"

#include <torch/csrc/autograd/custom_function.h>

#include "tp/saved_group.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The length of this rank's chunk of dim 1. TORCH_CHECK_VALUE: Python sees the ValueError the model's checks raise.
int64_t chunk_length(const at::Tensor& x, int64_t parts) {
  TORCH_CHECK_VALUE(x.dim() >= 2, "sequence parallel: needs a [b, s, ...] tensor, got ", x.dim(), " dimensions");
  TORCH_CHECK_VALUE(x.size(1) % parts == 0, "sequence parallel: sequence length ", x.size(1),
                    " is not divisible by the model-parallel size ", parts);
  return x.size(1) / parts;
}

// [b, s/p, ...] -> [b, s, ...]. Gathered flat: gloo's all-gather into one tensor checks each piece's shape
// against the input's, so both are 1-D; NCCL only counts elements.
PendingCollective all_gather_seq_start(const at::Tensor& x, const GroupPtr& group) {
  TORCH_CHECK_VALUE(x.dim() >= 2, "sequence parallel: needs a [b, s/p, ...] tensor, got ", x.dim(), " dimensions");
  const int64_t parts = group->getSize();
  at::Tensor mine = x.contiguous();  // incoming gradients may be expanded views
  at::Tensor flat = at::empty({parts * mine.numel()}, mine.options());
  at::Tensor mine_flat = mine.view({-1});
  auto work = all_gather_into_async(flat, mine_flat, group);
  std::vector<int64_t> slab_shape{parts};
  slab_shape.insert(slab_shape.end(), mine.sizes().begin(), mine.sizes().end());
  return {work, [flat, slab_shape, mine] { return sequence_from_slabs(flat.view(slab_shape)); }};
}

// [b, s, ...] partial sums -> this rank's chunk [b, s/p, ...] of their sum, a fresh tensor (the input may alias
// another gradient, so nothing is reduced in place on it).
PendingCollective reduce_scatter_seq_start(const at::Tensor& x, const GroupPtr& group) {
  const int64_t parts = group->getSize();
  const int64_t chunk = chunk_length(x, parts);
  if (!has_reduce_scatter(group)) {
    at::Tensor total = x.clone(at::MemoryFormat::Contiguous);
    auto work = all_reduce_sum_async(total, group);
    const int64_t start = group->getRank() * chunk;
    return {work, [total, start, chunk] { return total.narrow(1, start, chunk).contiguous(); }};
  }
  at::Tensor slabs = sequence_to_slabs(x, parts);
  at::Tensor out = at::empty_like(slabs[0]);
  auto work = reduce_scatter_into_async(out, slabs, group);
  return {work, [out, slabs] { return out; }};
}

at::Tensor all_gather_seq(const at::Tensor& x, const GroupPtr& group) { return all_gather_seq_start(x, group).wait(); }

at::Tensor reduce_scatter_seq(const at::Tensor& x, const GroupPtr& group) {
  return reduce_scatter_seq_start(x, group).wait();
}

struct GatherSeq : public torch::autograd::Function<GatherSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return all_gather_seq(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {reduce_scatter_seq(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSeq : public torch::autograd::Function<ReduceScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return reduce_scatter_seq(x, group);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {all_gather_seq(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ScatterSeq : public torch::autograd::Function<ScatterSeq> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    const int64_t chunk = chunk_length(x, group->getSize());
    return x.narrow(1, group->getRank() * chunk, chunk).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {all_gather_seq(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor sequence_to_slabs(const at::Tensor& x, int64_t parts) {
  const int64_t chunk = chunk_length(x, parts);
  std::vector<int64_t> split{x.size(0), parts, chunk};
  split.insert(split.end(), x.sizes().begin() + 2, x.sizes().end());
  return x.reshape(split).movedim(1, 0).contiguous();
}

at::Tensor sequence_from_slabs(const at::Tensor& slabs) {
  TORCH_CHECK_VALUE(slabs.dim() >= 3, "sequence_from_slabs: needs [p, b, s/p, ...], got ", slabs.dim(),
                    " dimensions");
  return slabs.movedim(0, 1).flatten(1, 2);
}

at::Tensor gather_along_sequence(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return GatherSeq::apply(x, group);
}

at::Tensor reduce_scatter_along_sequence(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return ReduceScatterSeq::apply(x, group);
}

at::Tensor scatter_along_sequence(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return ScatterSeq::apply(x, group);
}

PendingCollective all_gather_seq_async(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return {{}, [x] { return x; }};
  return all_gather_seq_start(x, group);
}

PendingCollective reduce_scatter_seq_async(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return {{}, [x] { return x; }};
  return reduce_scatter_seq_start(x, group);
}

}  // namespace hybrid
