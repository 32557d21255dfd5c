// Deferred weight gradients: the "W" half of a zero-bubble backward (Qi et al. 2023, "Zero Bubble Pipeline
// Parallelism", https://arxiv.org/abs/2401.10241).
//
// A zero-bubble schedule splits a stage's backward into I (input gradient: on the critical path, the previous
// stage waits for it) and W (weight gradient: nobody waits, so it fills a bubble later). The executor runs I
// inside a DeferWeightGrads scope: every hybrid::linear (and fused chain) of the engine then computes its input
// gradient only and stashes (input, grad_output, weight, bias) here under the scope's (stage, micro) key. The W
// action asks the GradBuffer that owns this store to flush the key (grad/grad_buffer.h).
//
// One store per GradBuffer, i.e. per engine: two engines in one process never see each other's stashes. Not
// thread-local: on CUDA, autograd runs a backward on a per-device worker thread, which would not see the
// caller's thread-locals. A mutex guards it.
//
// Deferral applies only to leaf weights (parameters) in a first-order backward. A non-leaf weight (an autocast
// copy, a view) gets its gradient immediately so autograd can carry it on to the parameter.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
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
  void set_defer(bool defer);
  bool defer() const;
  // Labels what later backward passes stash. Stashing while deferring with no key begun is an error.
  void begin(WgradKey key);
  void end();  // no key: stashing is an error again
  std::optional<WgradKey> current_key() const;

  // Called from a linear's backward while deferring.
  void stash(WgradEntry entry);
  // Removes and returns the stashes of `keys`, in key order then stash order (unknown keys are skipped).
  std::vector<WgradEntry> take(const std::vector<WgradKey>& keys);
  std::vector<WgradKey> keys() const;  // every key with stashes, in key order

  size_t pending() const;  // stashed entries, all keys
  size_t pending(WgradKey key) const;
  // Drops every stash without computing it, and leaves defer mode (recovery after a failed step).
  void clear();

 private:
  mutable std::mutex mutex_;
  bool defer_ = false;
  std::optional<WgradKey> current_;
  std::map<WgradKey, std::vector<WgradEntry>> stash_;
};

// Scope of an I action: `store` defers with `key` begun; the previous mode and key come back on exit.
class DeferWeightGrads {
 public:
  DeferWeightGrads(WeightGradStore& store, WgradKey key);
  ~DeferWeightGrads();
  DeferWeightGrads(const DeferWeightGrads&) = delete;
  DeferWeightGrads& operator=(const DeferWeightGrads&) = delete;

 private:
  WeightGradStore& store_;
  bool previous_defer_;
  std::optional<WgradKey> previous_key_;
};

}  // namespace hybrid
