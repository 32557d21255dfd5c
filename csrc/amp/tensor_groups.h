// Fused foreach kernels (AMP unscale, norm, mul) take one device and one dtype per call: split a gradient
// list the way torch.amp.GradScaler and torch.nn.utils.clip_grad_norm_ do.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace hybrid {

struct TensorBucket {
  at::Device device;
  at::ScalarType dtype;
  std::vector<at::Tensor> tensors;
};

// Buckets in order of first appearance; undefined tensors (a parameter without a gradient) are skipped.
std::vector<TensorBucket> group_by_device_and_dtype(const std::vector<at::Tensor>& tensors);

}  // namespace hybrid
