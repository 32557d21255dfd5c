// Deferred weight gradients: the "W" half of a zero-bubble backward (Qi et al. 2023, "Zero Bubble Pipeline
// Parallelism", https://arxiv.org/abs/2401.10241).
//
// A zero-bubble schedule splits a stage's backward into I (input gradient: on the critical path, the previous
// stage waits for it) and W (weight gradient: nobody waits, so it fills a bubble later). The executor runs I as
// an ordinary autograd backward inside a DeferWeightGrads scope: every hybrid::linear then computes its input
// gradient only and stashes (input, grad_output, weight, bias) here under the scope's key. The W action calls
// flush(key), which computes dW = grad_output^T input and db = sum(grad_output) and accumulates them into the
// parameters' .grad exactly as autograd's AccumulateGrad would (allocate on first use, add afterwards).
//
// The store is process-wide, not thread-local: on CUDA, autograd runs a backward on a per-device worker thread,
// which would not see the caller's thread-locals. A mutex guards it.
//
// Deferral applies only to leaf weights (parameters) in a first-order backward. A non-leaf weight (an autocast
// copy, a view) gets its gradient immediately so autograd can carry it on to the parameter.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace hybrid {

// Which backward a stash belongs to: (stage, micro-batch), as in the schedule's actions.
struct WgradKey {
  int stage = 0;
  int micro = 0;
  bool operator<(const WgradKey& o) const { return stage != o.stage ? stage < o.stage : micro < o.micro; }
  bool operator==(const WgradKey& o) const { return stage == o.stage && micro == o.micro; }
};

// One linear's deferred weight gradient.
struct WgradEntry {
  at::Tensor input;        // [rows, in], detached
  at::Tensor grad_output;  // [rows, out], detached
  at::Tensor weight;       // the parameter that receives dW; undefined when it needs no gradient
  at::Tensor bias;         // the parameter that receives db; undefined when none or it needs no gradient
};

class WeightGradStore {
 public:
  static WeightGradStore& instance();

  void set_defer(bool defer);
  bool defer() const;
  // Labels what later backward passes stash. Stashing while deferring with no key begun is an error.
  void begin(WgradKey key);
  void end();  // no key: stashing is an error again
  std::optional<WgradKey> current_key() const;

  // Called from a linear's backward while deferring.
  void stash(WgradEntry entry);

  // Each returns the parameters whose .grad it updated, each once, in first-stashed order (for DP bucketing:
  // a flush bypasses autograd, so no gradient hooks fire).
  //
  // The key's stashes one by one, in stash order; frees them. An unknown key is a no-op.
  std::vector<at::Tensor> flush(WgradKey key);
  // All stashes of several keys with one GEMM per parameter: rows of input and grad_output concatenated, so the
  // GEMM's reduction dimension is the sum of the micro-batches' rows. Equal to flushing the keys one by one up to
  // floating-point rounding order.
  // overwrite: the keys hold every contribution of the step, so each gradient is written, not added to
  // (the caller skips zeroing the gradients, and the GEMM skips reading them).
  std::vector<at::Tensor> flush_merged(const std::vector<WgradKey>& keys, bool overwrite = false);
  // Every key, in key order.
  std::vector<at::Tensor> flush_all();

  size_t pending() const;  // stashed entries, all keys
  size_t pending(WgradKey key) const;
  // Drops every stash without computing it, and leaves defer mode (recovery after a failed step).
  void clear();

 private:
  std::vector<WgradEntry> take(const std::vector<WgradKey>& keys);

  mutable std::mutex mutex_;
  bool defer_ = false;
  std::optional<WgradKey> current_;
  std::map<WgradKey, std::vector<WgradEntry>> stash_;
};

// Scope of an I action: defer on with `key` begun; the previous mode and key come back on exit.
class DeferWeightGrads {
 public:
  explicit DeferWeightGrads(WgradKey key);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  bool previous_defer_;
  std::optional<WgradKey> previous_key_;
};

// The tensor a parameter's gradient accumulates into: param.grad today. The one place to redirect to a separate
// fp32 accumulation buffer for half-precision weights.
at::Tensor& grad_target(const at::Tensor& param);

// Announcing final gradients. A C++ backward path that writes a parameter's gradient itself (a fused chain, a W
// flush) calls grad_final(param) right after the parameter's last write within that call; the listener (the
// executor's DP gradient sync, installed only while a stage's last gradient action runs, so that such a write is
// the step's last) receives grad_target(param) and may start reducing it while the backward goes on.
// Process-wide behind a mutex, like the store: on CUDA the backward runs on autograd's device thread.
using GradFinalListener = std::function<void(const at::Tensor& grad)>;
// An empty listener removes it. The listener runs under the registry's lock: it must not set a listener.
void set_grad_final_listener(GradFinalListener listener);
void grad_final(const at::Tensor& param);

// dW = grad_output^T input for [rows, out] and [rows, in]; the same GEMM autograd's addmm/mm backward runs.
at::Tensor linear_weight_grad(const at::Tensor& grad_output_2d, const at::Tensor& input_2d);
// db = grad_output summed over rows, reduced as autograd reduces a broadcast bias.
at::Tensor linear_bias_grad(const at::Tensor& grad_output_2d, const at::Tensor& bias);

// grad_target(weight) += grad_output^T input (in-place GEMM once the gradient exists) and likewise for bias.
void accumulate_linear_grads(const at::Tensor& grad_output_2d, const at::Tensor& input_2d, const at::Tensor& weight,
                             const at::Tensor& bias, bool overwrite = false);

}  // namespace hybrid
