// Data-parallel gradient summation in flat buckets, launched asynchronously as soon as a bucket's
// gradients are final, waited for once at the end of the step.
//
// The engine lays each bucket's parameter gradients out as views into one flat tensor, so autograd (and
// the deferred weight-gradient store) accumulate straight into the buffer that gets all-reduced: no copy in,
// no copy out. The all-reduce sums; the engine has already folded 1/dp into the loss multiplier, so the sum
// is the DP mean without another pass over the gradients.
//
// Early launch (overlap with the backward): the executor arms the buckets of a stage just before that stage's
// last gradient action; during it, the C++ backward paths that write gradients themselves (fused chains, W
// flushes) announce each gradient after its last write (notify). A bucket whose every element has been
// announced is launched at once, while the backward of earlier layers goes on. Whatever was not announced
// (ordinary autograd modules) is launched by the executor after the action, and finish() launches the rest:
// correctness never depends on the announcements, only the overlap does.
//
// Keeping only the shard (ZeRO-2): with `keep_shards`, once a bucket's reduce-scatter is done its DP rank's piece is
// copied into keep_shards[bucket] and the bucket's bytes are released (grad/released_storage.h), so a whole bucket
// lives only from the step's start to its own reduce-scatter; finished collectives are collected as each new one
// is launched, not only at finish(). restore() brings every bucket back, zeroed, before the next step's backward.
//
// Per micro-batch (`every_micro`, with keep_shards): the executor arms and launches a stage's buckets after every
// gradient action, not only the last; each bucket's summed piece is added into its shard (zeroed by restore()),
// and the bucket released until the backward writes it again (GradBuffer restores it on the first write). A
// bucket is then whole only from its first write in a micro-batch's backward to its reduce-scatter; the next
// arm() finishes the reductions still running (they travel beside the forwards in between). The gradients move
// once per micro-batch instead of once per step.
//
// Hybrid sharding: with a `replica_group` (the same shard position in every sharded copy), each bucket's summed
// piece is then all-reduced over it once the backward is over (finish), bucket by bucket in launch order.
//
// Wire dtype (optional, e.g. bf16 for fp32 buckets): a bucket is cast to it when launched, the narrower copy is
// summed, and finish() casts the sum back into the bucket. Half the bytes on the link for fp32 gradients, at the
// price of rounding each replica's gradient (and the sum) to the wire dtype's precision: PyTorch DDP's
// bf16_compress_hook, Megatron's gradient reduction in bf16. Gradients are still accumulated in the bucket's
// dtype; only what travels is rounded.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "comm/collectives.h"
#include "comm/comm_trace.h"

namespace hybrid {

// Why a bucket's all-reduce started: announced complete, by the executor after the stage's last gradient
// action, or by finish().
enum class LaunchCause { Notified = 0, ActionEnd = 1, Finish = 2 };

struct BucketLaunch {
  int bucket = 0;
  LaunchCause cause = LaunchCause::ActionEnd;
};

class DpGradSync {
 public:
  // buckets[i] is the flat gradient buffer of bucket i; group is the DP group (trivial group: no-op).
  // wire_dtype: the dtype buckets travel in (nullopt: their own); a bucket already of that dtype is sent as is.
  // shard: reduce-scatter instead of all-reduce (the distributed optimizer, ZeRO-1): afterwards each DP rank's
  // equal piece of every bucket holds the sum, the rest of the bucket is unspecified. Every bucket's size must
  // divide by the DP size (GradBuffer pads them). trace: where launches are recorded for --trace (may be null).
  DpGradSync(std::vector<at::Tensor> buckets, GroupPtr dp_group, std::optional<at::ScalarType> wire_dtype = {},
             bool shard = false, std::shared_ptr<CommTrace> trace = nullptr,
             std::vector<at::Tensor> keep_shards = {}, GroupPtr replica_group = nullptr, bool every_micro = false);

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Start the all-reduce of one bucket; each bucket is launched at most once per step.
  void launch(int bucket, LaunchCause cause = LaunchCause::ActionEnd);

  // From arm until disarm, notify may launch these buckets (and no other).
  void arm(const std::vector<int>& buckets);
  void disarm();
  // `grad` (contiguous, a view into an armed bucket) has had its last write of the step. Returns whether this
  // completed its bucket and launched it. Anything else (another bucket's tensor, a tensor outside every
  // bucket, a repeat or partial overlap of an earlier announcement) is ignored.
  bool notify(const at::Tensor& grad);

  // Launch whatever has not been launched (bucket order), wait for all. The buckets then hold the DP sum.
  void finish();
  std::optional<at::ScalarType> wire_dtype() const { return wire_dtype_; }
  bool shard() const { return shard_; }
  bool keeps_shards() const { return !keep_shards_.empty(); }
  bool every_micro() const { return every_micro_; }
  // Reallocate every released bucket (keep_shards) and zero every bucket: before the step's first gradient write.
  void restore();
  // Forget launches of an aborted step.
  void reset();

  // The launches of the last finished step, in launch order.
  std::vector<BucketLaunch> last_step_launches() const;

 private:
  void launch_locked(int bucket, LaunchCause cause);
  void rearm_locked(int bucket);  // every_micro: launchable again for the next micro-batch
  void clear_step_locked();

  // An all-reduce in flight: its work and, when the bucket travels in the wire dtype, the narrower copy that is
  // summed (cast back into the bucket once the work is done).
  struct InFlight {
    c10::intrusive_ptr<c10d::Work> work;
    int bucket = 0;
    at::Tensor wire;
  };
  void complete(std::vector<InFlight>& in_flight);
  void complete_one(InFlight& f);
  void keep_shard_and_release(int bucket, const at::Tensor& summed);
  // The pending collectives already done, and beyond the newest kShardedInFlight the oldest, waited for (keep_shards
  // only): on a GPU the host runs ahead of the NCCL stream and would see none done during a backward, leaving every
  // bucket whole at once; waiting makes only the current stream wait, so the bucket is released in stream order.
  void complete_finished_locked();
  static constexpr size_t kShardedInFlight = 2;

  std::vector<at::Tensor> buckets_;
  GroupPtr dp_group_;
  std::optional<at::ScalarType> wire_dtype_;
  bool shard_ = false;
  std::shared_ptr<CommTrace> trace_;
  std::vector<at::Tensor> keep_shards_;
  GroupPtr replica_group_;
  bool every_micro_ = false;
  std::unordered_map<const c10::StorageImpl*, int> by_storage_;  // bucket storage -> bucket

  // Announcements may arrive on autograd's device thread (CUDA), so everything below is under the mutex.
  mutable std::mutex mutex_;
  std::vector<InFlight> pending_;
  std::vector<bool> launched_;
  std::vector<bool> armed_;
  // Per bucket, this step: the byte ranges announced final (start -> end, disjoint) and the bytes still not.
  std::vector<std::map<uintptr_t, uintptr_t>> announced_;
  std::vector<int64_t> unannounced_bytes_;
  std::vector<BucketLaunch> launches_;  // this step's, so far
  std::vector<BucketLaunch> last_launches_;
};

}  // namespace hybrid
