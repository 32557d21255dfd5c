// CUDA side of csrc/optim/sgd_cast.h: master -= lr * grad; half = cast(master), one read of each input and
// one write of each output. Built only when the installed torch has CUDA (CMakeLists.txt).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>

namespace hybrid {

namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // float4 loads of master and grad

// Same expression as torch's foreach add with alpha: master + alpha * grad, alpha = -lr, in fp32.
__device__ __forceinline__ float sgd(float master, float grad, float alpha) { return master + alpha * grad; }

template <typename Half>
struct alignas(sizeof(Half) * kVec) HalfVec {
  Half v[kVec];
};

template <typename Half>
__global__ void sgd_cast_vec(float* __restrict__ master, const float* __restrict__ grad, Half* __restrict__ half,
                             int64_t n_vec, float alpha) {
  auto* m4 = reinterpret_cast<float4*>(master);
  const auto* g4 = reinterpret_cast<const float4*>(grad);
  auto* h4 = reinterpret_cast<HalfVec<Half>*>(half);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_vec;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float4 m = m4[i];
    const float4 g = g4[i];
    m.x = sgd(m.x, g.x, alpha);
    m.y = sgd(m.y, g.y, alpha);
    m.z = sgd(m.z, g.z, alpha);
    m.w = sgd(m.w, g.w, alpha);
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
                                int64_t begin, int64_t n, float alpha) {
  for (int64_t i = begin + blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float m = sgd(master[i], grad[i], alpha);
    master[i] = m;
    half[i] = static_cast<Half>(m);
  }
}

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

int blocks_for(int64_t items) {
  // Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 8)));
}

}  // namespace

void sgd_step_and_cast_cuda(const at::Tensor& master, const at::Tensor& grad, const at::Tensor& half, float lr) {
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
        sgd_cast_vec<scalar_t><<<blocks_for(n_vec), kThreads, 0, stream>>>(m, g, h, n_vec, alpha);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      }
      vec_end = n_vec * kVec;
    }
    if (vec_end < n) {
      sgd_cast_scalar<scalar_t><<<blocks_for(n - vec_end), kThreads, 0, stream>>>(m, g, h, vec_end, n, alpha);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
}

}  // namespace hybrid
