#include "amp/nonfinite.h"

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/nonfinite.cu: stores 1.0f into `flag` (a float32 [1] on tensor's device) if `tensor` (fp32,
// contiguous, CUDA) holds an inf or NaN; leaves it alone otherwise.
void flag_nonfinite_cuda(const at::Tensor& tensor, const at::Tensor& flag);
#endif

namespace {

// Any dtype, layout or device, on the stream order of `flag`'s device: no host sync unless the tensor
// lives on another device. Integer and bool tensors are always finite (isfinite says so).
void flag_nonfinite_aten(const at::Tensor& tensor, at::Tensor& flag) {
  const at::Tensor bad = at::logical_not(at::isfinite(tensor)).any().to(flag.device(), at::kFloat).reshape({1});
  flag.copy_(at::maximum(flag, bad));
}

}  // namespace

at::Tensor nonfinite_flag(const std::vector<at::Tensor>& tensors, at::Device device) {
  at::Tensor flag = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(device));
  for (const auto& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
#ifdef HYBRID_WITH_CUDA
    if (t.is_cuda() && t.device() == flag.device() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
      flag_nonfinite_cuda(t, flag);
      continue;
    }
#endif
    flag_nonfinite_aten(t, flag);
  }
  return flag;
}

}  // namespace hybrid
