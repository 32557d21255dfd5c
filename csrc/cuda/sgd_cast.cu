// CUDA side of csrc/optim/sgd_cast.h: master -= lr * grad * inv_scale; half = cast(master), one read of each
// input and one write of each output, none at all when the skip flag is set. Built only when the installed
// torch has CUDA (CMakeLists.txt).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

#include "cuda/grid_stride.cuh"

namespace hybrid {

namespace {

using cuda_launch::aligned;
using cuda_launch::HalfVec;
using cuda_launch::blocks_for;
using cuda_launch::kThreads;
using cuda_launch::kVec;

// Same expressions as the AMP unscale kernel (one rounded fp32 multiply: __fmul_rn is never contracted into
// an FMA) followed by torch's foreach add with alpha: master + alpha * grad, alpha = -lr, in fp32. By 1 the
// multiply is exact, so the plain step's results are unchanged.
__device__ __forceinline__ float sgd(float master, float grad, float inv_scale, float alpha) {
  return master + alpha * __fmul_rn(grad, inv_scale);
}

// A set flag (nonzero, NaN included) skips the step: read once per thread, before anything is touched.
__device__ __forceinline__ bool skipped(const float* skip_if) { return skip_if != nullptr && *skip_if != 0.0f; }

template <typename Half>
__global__ void sgd_cast_vec(float* __restrict__ master, const float* __restrict__ grad, Half* __restrict__ half,
                             int64_t n_vec, float alpha, float inv_scale, const float* __restrict__ skip_if) {
  if (skipped(skip_if)) return;
  auto* m4 = reinterpret_cast<float4*>(master);
  const auto* g4 = reinterpret_cast<const float4*>(grad);
  auto* h4 = reinterpret_cast<HalfVec<Half>*>(half);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_vec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 m = m4[i];
    const float4 g = g4[i];
    m.x = sgd(m.x, g.x, inv_scale, alpha);
    m.y = sgd(m.y, g.y, inv_scale, alpha);
    m.z = sgd(m.z, g.z, inv_scale, alpha);
    m.w = sgd(m.w, g.w, inv_scale, alpha);
    m4[i] = m;
    HalfVec<Half> h;
    h.v[0] = static_cast<Half>(m.x);
    h.v[1] = static_cast<Half>(m.y);
    h.v[2] = static_cast<Half>(m.z);
    h.v[3] = static_cast<Half>(m.w);
    h4[i] = h;
  }
}

// The tail (and any tensor whose pointers are not vector-aligned), one element per thread.
template <typename Half>
__global__ void sgd_cast_scalar(float* __restrict__ master, const float* __restrict__ grad, Half* __restrict__ half,
                                int64_t begin, int64_t n, float alpha, float inv_scale,
                                const float* __restrict__ skip_if) {
  if (skipped(skip_if)) return;
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float m = sgd(master[i], grad[i], inv_scale, alpha);
    master[i] = m;
    half[i] = static_cast<Half>(m);
  }
}

}  // namespace

void sgd_step_and_cast_cuda(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, float lr,
                            float inv_scale, const float* skip_if) {
  const int64_t n = master.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(master.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const float alpha = -lr;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, half.scalar_type(), "sgd_step_and_cast", [&] {
    float* m = master.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    scalar_t* h = half.data_ptr<scalar_t>();
    int64_t vec_end = 0;
    if (aligned(m, 16) && aligned(g, 16) && aligned(h, sizeof(scalar_t) * kVec)) {
      const int64_t n_vec = n / kVec;
      if (n_vec > 0) {
        sgd_cast_vec<scalar_t><<<blocks_for(n_vec), kThreads, 0, stream>>>(m, g, h, n_vec, alpha, inv_scale,
                                                                             skip_if);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      vec_end = n_vec * kVec;
    }
    if (vec_end < n) {
      sgd_cast_scalar<scalar_t><<<blocks_for(n - vec_end), kThreads, 0, stream>>>(m, g, h, vec_end, n, alpha,
                                                                                  inv_scale, skip_if);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace hybrid
