#include "tp/mp_region.h"

#include <torch/csrc/autograd/custom_function.h>

#include "tp/saved_group.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Incoming gradients may alias each other (an add node hands the same tensor to both inputs) or be expanded
// views, so a collective never works in place on them.
at::Tensor reduced_copy(const at::Tensor& t, const GroupPtr& group) {
  at::Tensor out = t.clone(at::MemoryFormat::Contiguous);
  all_reduce_sum(out, group);
  return out;
}

struct CopyToMpRegion : public torch::autograd::Function<CopyToMpRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    save_group(ctx, group);
    return x;  // autograd turns a returned input into a fresh alias carrying this node
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    return {reduced_copy(grads[0], saved_group(ctx)), at::Tensor()};
  }
};

struct ReduceFromMpRegion : public torch::autograd::Function<ReduceFromMpRegion> {
  static at::Tensor forward(AutogradContext* /*ctx*/, const at::Tensor& x, const GroupPtr& group) {
    return reduced_copy(x, group);
  }
  static variable_list backward(AutogradContext* /*ctx*/, variable_list grads) { return {grads[0], at::Tensor()}; }
};

struct GatherFromMpRegion : public torch::autograd::Function<GatherFromMpRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const GroupPtr& group) {
    TORCH_CHECK(x.dim() >= 1, "gather_from_mp_region needs a tensor with at least one dimension");
    save_group(ctx, group);
    ctx->saved_data["local"] = x.size(-1);
    return at::cat(all_gather(x, group), -1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor()};
    int64_t local = ctx->saved_data.at("local").toInt();
    int64_t rank = saved_group(ctx)->getRank();
    return {grads[0].narrow(-1, rank * local, local).contiguous(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_mp_region(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return CopyToMpRegion::apply(x, group);
}

at::Tensor reduce_from_mp_region(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return ReduceFromMpRegion::apply(x, group);
}

at::Tensor gather_from_mp_region(const at::Tensor& x, const GroupPtr& group) {
  if (is_trivial(group)) return x;
  return GatherFromMpRegion::apply(x, group);
}

}  // namespace hybrid
