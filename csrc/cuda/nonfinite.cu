// CUDA side of csrc/amp/nonfinite.h: one read-only pass over a tensor that raises a flag on inf or NaN.
// Built only when the installed torch has CUDA (CMakeLists.txt).
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "cuda/grid_stride.cuh"

namespace hybrid {

namespace {

using cuda_launch::aligned;
using cuda_launch::blocks_for;
using cuda_launch::kThreads;
using cuda_launch::kVec;

// inf and NaN are exactly the floats whose exponent bits are all ones. A bit test rather than isfinite():
// fast-math builds may assume finite values and fold isfinite() to true.
__device__ __forceinline__ bool nonfinite(float x) { return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u; }

// Elements [0, n_vec * kVec) as float4, the rest one by one (all of them when n_vec is 0: a misaligned
// view). Each thread only reads; one that saw a bad value stores 1.0f. Every writer stores the same value,
// so the races are benign and no atomics are needed; a clean tensor writes nothing.
__global__ void flag_nonfinite_kernel(const float* __restrict__ x, int64_t n, int64_t n_vec,
                                      float* __restrict__ flag) {
  const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const auto* x4 = reinterpret_cast<const float4*>(x);
  bool bad = false;
  for (int64_t i = first; i < n_vec; i += stride) {
    const float4 v = x4[i];
    bad |= nonfinite(v.x) | nonfinite(v.y) | nonfinite(v.z) | nonfinite(v.w);
  }
  for (int64_t i = n_vec * kVec + first; i < n; i += stride) bad |= nonfinite(x[i]);
  if (bad) *flag = 1.0f;
}

}  // namespace

void flag_nonfinite_cuda(const at::Tensor& tensor, const at::Tensor& flag) {
  const int64_t n = tensor.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(tensor.device());
  const float* x = tensor.data_ptr<float>();
  const int64_t n_vec = aligned(x, 16) ? n / kVec : 0;
  const int64_t items = n_vec > 0 ? n_vec : n;  // the tail is shorter than the vector body's thread count
  flag_nonfinite_kernel<<<blocks_for(items), kThreads, 0, at::cuda::getCurrentCUDAStream()>>>(
      x, n, n_vec, flag.data_ptr<float>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

}  // namespace hybrid
