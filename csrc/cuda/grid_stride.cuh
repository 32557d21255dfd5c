// Launch helpers shared by the memory-bound elementwise kernels in csrc/cuda/: a grid-stride loop over
// float4 vectors where every pointer allows it, one element at a time elsewhere.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace hybrid {
namespace cuda_launch {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // float4 loads

// kVec half values (fp16 or bf16) loaded or stored as one vector, beside a float4 of their fp32 counterparts.
template <typename Half>
struct alignas(sizeof(Half) * kVec) HalfVec {
  Half v[kVec];
};

inline bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Enough blocks to fill every SM several times over; the grid-stride loop covers the rest.
inline int blocks_for(int64_t items) {
  const int sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  const int64_t wanted = (items + kThreads - 1) / kThreads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, static_cast<int64_t>(sms) * 8)));
}

}  // namespace cuda_launch
}  // namespace hybrid
