// Releasing a flat buffer's bytes while every view of it stays valid (ZeRO-2's gradient buckets between their
// reduce-scatter and the next step, ZeRO-3's parameter buffers between their uses): the StorageImpl is kept and only
// its allocation dropped, so views (parameters, .grad, fp32 main grads, autograd's saved tensors) point at the
// same storage once it is restored. A released buffer must not be read or written until restored; a restored one
// holds garbage until written (the caller zeroes it or gathers into it).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

namespace hybrid {

inline bool storage_released(const at::Tensor& flat) { return flat.storage().nbytes() == 0 && flat.numel() > 0; }

inline void release_storage(const at::Tensor& flat) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.storage_offset() == 0,
              "release_storage: a flat buffer that owns its storage from its start");
  c10::StorageImpl* impl = flat.storage().unsafeGetStorageImpl();
  impl->set_data_ptr_noswap(at::DataPtr(nullptr, flat.device()));  // the old allocation is freed here
  impl->set_nbytes(0);
}

// Reallocate a released buffer's bytes (uninitialised); a no-op for one that holds them.
inline void restore_storage(const at::Tensor& flat) {
  if (!storage_released(flat)) return;
  c10::StorageImpl* impl = flat.storage().unsafeGetStorageImpl();
  TORCH_CHECK(impl->allocator() != nullptr, "restore_storage: the buffer's storage has no allocator");
  const size_t nbytes = flat.nbytes();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

}  // namespace hybrid
