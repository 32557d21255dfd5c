// One engine's gradients: where each parameter's gradient lives, the deferred weight gradients (zero-bubble W),
// and who is told when a gradient is final. Owned by the engine; the executor, hybrid::linear and the fused
// chains reach it through the handle they were given, never through process-wide state, so two engines can live
// in one process and closing one never disturbs the other.
//
// Buckets: flat tensors that hold a DP sync unit's gradients back to back (the engine lays them out, last layer
// first; grad views of parameters, or fp32 main grads of half weights, point into them). The DP sync reduces a
// bucket as a whole: all-reduced today; a distributed optimizer reduce-scatters it so each DP rank keeps the
// summed shard it updates (bucket_shard below gives every rank the same split).
//
// Main grads (Megatron's name): with weights kept in fp16/bf16 for the step, a half weight's gradient is routed
// to an fp32 view instead of its own .grad, and every C++ gradient writer accumulates there with one GEMM that
// reads half inputs and sums in fp32 — summing micro-batches never rounds to half precision.
//
// Final-gradient announcements: a C++ path that writes a gradient itself (a fused chain, a W flush) calls
// grad_final(param) right after the parameter's last write in that call. While the executor runs a stage's last
// gradient action it installs a listener (the DP sync's notify) that may start reducing a bucket at once.
#pragma once

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grad/weight_grad_store.h"

namespace hybrid {

using GradFinalListener = std::function<void(const at::Tensor& grad)>;

class GradBuffer : public torch::CustomClassHolder {
 public:
  explicit GradBuffer(std::vector<at::Tensor> buckets = {});

  const std::vector<at::Tensor>& buckets() const { return buckets_; }
  // [begin, end) elements of `bucket` that DP rank `rank` of `size` owns: equal contiguous pieces, the last one
  // shorter when the size does not divide (what a reduce-scatter into shards uses).
  std::pair<int64_t, int64_t> bucket_shard(int bucket, int rank, int size) const;

  // Route `param`'s gradient into `buffer` (same shape, any float dtype) instead of param.grad.
  void set_main_grad(const at::Tensor& param, const at::Tensor& buffer);
  bool has_main_grad(const at::Tensor& param) const;
  // The tensor `param`'s gradient accumulates into: its main grad, else param.grad (undefined until the first
  // write allocates it).
  at::Tensor& grad_target(const at::Tensor& param);

  WeightGradStore& wgrad() { return wgrad_; }

  // While set (ZeRO-2/3 reducing per micro-batch), a bucket released after its reduction (grad/released_storage.h)
  // is restored and zeroed by the first grad_target() that returns a view into it: every gradient write goes through
  // grad_target, so a bucket exists only from its first write to its reduction.
  void set_restore_on_write(bool restore) { restore_on_write_.store(restore); }

  // While set (an OverwriteWeightGrads scope), the backward running is every gradient's only write of the step:
  // a native chain then writes its weight gradients instead of adding them (the step skips zeroing them).
  bool overwrites() const { return overwrite_.load(); }
  void set_overwrites(bool overwrite) { overwrite_.store(overwrite); }

  // grad_target(weight) += grad_output^T input (in-place GEMM once the gradient exists) and likewise for bias;
  // overwrite: write instead of adding (the caller knows this is the step's only contribution).
  void accumulate_linear_grads(const at::Tensor& grad_output_2d, const at::Tensor& input_2d,
                               const at::Tensor& weight, const at::Tensor& bias, bool overwrite = false);

  // The W action. Each returns the parameters whose gradient it updated, each once, in first-stashed order,
  // announcing each after its last write.
  // The key's stashes one by one, in stash order; frees them. An unknown key is a no-op.
  std::vector<at::Tensor> flush(WgradKey key);
  // Stashes that no key holds (a graphed stage's recorded ones, for a whole B): the same writes, in their order.
  std::vector<at::Tensor> flush_entries(std::vector<WgradEntry> entries);
  // All stashes of several keys with one GEMM per parameter: rows of input and grad_output concatenated, so the
  // GEMM's reduction dimension is the sum of the micro-batches' rows. Equal to flushing the keys one by one up to
  // floating-point rounding order. overwrite: the keys hold every contribution of the step, so each gradient is
  // written, not added to (the caller skips zeroing the gradients, and the GEMM skips reading them).
  std::vector<at::Tensor> flush_merged(const std::vector<WgradKey>& keys, bool overwrite = false);
  std::vector<at::Tensor> flush_all();  // every key, in key order

  // An empty listener removes it. The listener runs under the buffer's listener lock: it must not set one.
  void set_grad_final_listener(GradFinalListener listener);
  void grad_final(const at::Tensor& param);
  // While muted (a MutedGradFinal scope), grad_final announces nothing: a CUDA graph being captured records its
  // kernels without running them, so its writes are announced after each replay instead. `record` (optional):
  // where the muted announcements are appended, in order (what a replayer of autograd's backward announces).
  void set_grad_final_muted(bool muted, std::vector<at::Tensor>* record = nullptr);

 private:
  // write(i, just_params) gives the i-th weight-gradient write (just_params: only its weight and bias, for
  // finding each parameter's last write). Runs them in order, announcing every parameter after its last write;
  // returns the parameters, each once, in first-written order.
  using WriteFn = std::function<WgradEntry(size_t i, bool just_params)>;
  std::vector<at::Tensor> write_weight_grads(size_t count, const WriteFn& write, bool overwrite);

  std::vector<at::Tensor> buckets_;
  mutable std::mutex routes_mutex_;  // backward may run on autograd's device thread (CUDA)
  // Keyed by the parameter's TensorImpl; the parameter itself is kept so the key cannot be reused while routed.
  std::unordered_map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> main_grads_;
  WeightGradStore wgrad_;
  std::mutex listener_mutex_;
  GradFinalListener listener_;
  std::atomic<bool> listening_{false};  // lets grad_final skip the lock when nobody listens (most actions)
  std::atomic<bool> overwrite_{false};
  std::atomic<bool> muted_{false};
  std::vector<at::Tensor>* muted_record_ = nullptr;  // under listener_mutex_
  std::atomic<bool> restore_on_write_{false};
  std::mutex restore_mutex_;
  std::unordered_map<const c10::StorageImpl*, size_t> bucket_of_storage_;
  void restore_bucket_of(const at::Tensor& grad);
};

// Scope of a backward that writes every gradient of its stage for the last time in the step (its only write).
class OverwriteWeightGrads {
 public:
  explicit OverwriteWeightGrads(GradBuffer& grads) : grads_(grads) { grads_.set_overwrites(true); }
  ~OverwriteWeightGrads() { grads_.set_overwrites(false); }
  OverwriteWeightGrads(const OverwriteWeightGrads&) = delete;
  OverwriteWeightGrads& operator=(const OverwriteWeightGrads&) = delete;

 private:
  GradBuffer& grads_;
};

// Scope of a captured (or rerun) graph's weight-gradient writes: their final announcements are the replayer's
// (appended to `record` where given).
class MutedGradFinal {
 public:
  explicit MutedGradFinal(GradBuffer& grads, std::vector<at::Tensor>* record = nullptr) : grads_(grads) {
    grads_.set_grad_final_muted(true, record);
  }
  ~MutedGradFinal() { grads_.set_grad_final_muted(false); }
  MutedGradFinal(const MutedGradFinal&) = delete;
  MutedGradFinal& operator=(const MutedGradFinal&) = delete;

 private:
  GradBuffer& grads_;
};

using GradBufferPtr = c10::intrusive_ptr<GradBuffer>;

}  // namespace hybrid
