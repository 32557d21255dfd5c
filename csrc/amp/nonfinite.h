// Is any gradient inf or NaN? Answered on the device, read by nobody until the host needs it.
//
// DynamicLossScaler::unscale_and_check answers the same question with torch's fused AMP kernel, which also
// multiplies every gradient by 1/scale in place (a read and a write of every fp32 gradient) and is followed
// by a host sync. When the optimizer can apply 1/scale itself (sgd_step_and_cast's inv_scale) and skip
// itself on the device (its skip_if), the check only needs to read the gradients, and nothing needs to wait
// for the answer before the update is enqueued.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace hybrid {

// A float32 tensor of shape [1] on `device`: 1.0 if any element of any defined tensor is inf or NaN, else
// 0.0. Undefined tensors are skipped; any dtype, layout and device is accepted. No host sync on CUDA
// (unless a tensor lives on another device than `device`). On CUDA, fp32 contiguous tensors take one
// read-only vectorised kernel each; everything else takes ATen ops.
at::Tensor nonfinite_flag(const std::vector<at::Tensor>& tensors, at::Device device);

}  // namespace hybrid
