#include "amp/grad_clip.h"

#include <cmath>

#include "amp/tensor_groups.h"

namespace hybrid {

namespace {
// Sum of squared L2 norms, fp32 on `device`: one fused norm per device/dtype bucket (fp16 grads are
// reduced into fp32 so that a norm above 65504 does not overflow).
at::Tensor sum_of_squares(const std::vector<TensorBucket>& buckets, at::Device device) {
  at::Tensor total = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& bucket : buckets) {
    const auto norms = at::_foreach_norm(bucket.tensors, 2, at::kFloat);
    total.add_(at::stack(norms).square().sum().to(device));
  }
  return total;
}
}  // namespace

double clip_grad_norm(const std::vector<at::Tensor>& split_grads, const std::vector<at::Tensor>& replicated_grads,
                      double max_norm, const GroupPtr& mp_group, const GroupPtr& pp_group,
                      std::optional<at::Device> device) {
  const auto split = group_by_device_and_dtype(split_grads);
  const auto replicated = group_by_device_and_dtype(replicated_grads);
  const at::Device reduce_device = !split.empty()        ? split[0].device
                                   : !replicated.empty() ? replicated[0].device
                                                         : device.value_or(at::Device(at::kCPU));

  at::Tensor squares = sum_of_squares(split, reduce_device);
  if (is_trivial(mp_group) || mp_group->getRank() == 0) squares.add_(sum_of_squares(replicated, reduce_device));
  all_reduce_sum(squares, mp_group);
  all_reduce_sum(squares, pp_group);
  const double total_norm = squares.sqrt().item<double>();

  if (max_norm > 0.0 && std::isfinite(total_norm) && total_norm > max_norm) {
    const double coef = max_norm / (total_norm + 1e-6);
    for (const auto* buckets : {&split, &replicated}) {
      for (const auto& bucket : *buckets) at::_foreach_mul_(bucket.tensors, coef);
    }
  }
  return total_norm;
}

}  // namespace hybrid
