// CUDA side of grad/accumulate.h's add_into: an fp32 main grad += a half (fp16/bf16) gradient, read and written
// once with vector loads. ATen's add_ of mixed dtypes runs its unvectorized casting loop at about a quarter of the
// card's bandwidth (an H200 profile: ~1.2 TB/s), and every half gradient autograd hands a main grad goes through
// it once a micro-batch. Built only when the installed torch has CUDA (CMakeLists.txt).
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

// target + float(src) rounded once in fp32: what add_ computes for these dtypes, bit for bit.
template <typename Half>
__global__ void add_half_vec(float* __restrict__ target, const Half* __restrict__ src, int64_t n_vec) {
  auto* t4 = reinterpret_cast<float4*>(target);
  const auto* s4 = reinterpret_cast<const HalfVec<Half>*>(src);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_vec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 t = t4[i];
    const HalfVec<Half> s = s4[i];
    t.x += static_cast<float>(s.v[0]);
    t.y += static_cast<float>(s.v[1]);
    t.z += static_cast<float>(s.v[2]);
    t.w += static_cast<float>(s.v[3]);
    t4[i] = t;
  }
}

// The tail (and any tensor whose pointers are not vector-aligned), one element per thread.
template <typename Half>
__global__ void add_half_scalar(float* __restrict__ target, const Half* __restrict__ src, int64_t begin, int64_t n) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    target[i] += static_cast<float>(src[i]);
  }
}

}  // namespace

void add_half_into_float_cuda(const at::Tensor& target, const at::Tensor& src) {
  const int64_t n = target.numel();
  if (n == 0) return;
  const c10::cuda::CUDAGuard guard(target.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_REDUCED_FLOATING_TYPES(src.scalar_type(), "add_half_into_float", [&] {
    float* t = target.data_ptr<float>();
    const scalar_t* s = src.data_ptr<scalar_t>();
    int64_t vec_end = 0;
    if (aligned(t, 16) && aligned(s, sizeof(scalar_t) * kVec)) {
      const int64_t n_vec = n / kVec;
      if (n_vec > 0) {
        add_half_vec<scalar_t><<<blocks_for(n_vec), kThreads, 0, stream>>>(t, s, n_vec);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      vec_end = n_vec * kVec;
    }
    if (vec_end < n) {
      add_half_scalar<scalar_t><<<blocks_for(n - vec_end), kThreads, 0, stream>>>(t, s, vec_end, n);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace hybrid
