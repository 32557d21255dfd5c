#include "amp/tensor_groups.h"

#include <algorithm>
#include <iterator>

namespace hybrid {

std::vector<TensorBucket> group_by_device_and_dtype(const std::vector<at::Tensor>& tensors) {
  std::vector<TensorBucket> buckets;  // a rank has one device and a dtype or two: a linear scan is enough
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto it = std::find_if(buckets.begin(), buckets.end(), [&](const TensorBucket& b) {
      return b.device == t.device() && b.dtype == t.scalar_type();
    });
    if (it == buckets.end()) {
      buckets.push_back({t.device(), t.scalar_type(), {}});
      it = std::prev(buckets.end());
    }
    it->tensors.push_back(t);
  }
  return buckets;
}

}  // namespace hybrid
