#include "executor/dp_grad_sync.h"

#include <c10/util/Exception.h>

#include <iterator>
#include <stdexcept>

#include "grad/released_storage.h"

namespace hybrid {

DpGradSync::DpGradSync(std::vector<at::Tensor> buckets, GroupPtr dp_group,
                       std::optional<at::ScalarType> wire_dtype, bool shard, std::shared_ptr<CommTrace> trace,
                       std::vector<at::Tensor> keep_shards, GroupPtr replica_group, bool every_micro)
    : buckets_(std::move(buckets)),
      dp_group_(std::move(dp_group)),
      wire_dtype_(wire_dtype),
      shard_(shard),
      trace_(std::move(trace)),
      keep_shards_(std::move(keep_shards)),
      replica_group_(std::move(replica_group)),
      every_micro_(every_micro),
      launched_(buckets_.size(), false),
      armed_(buckets_.size(), false),
      announced_(buckets_.size()),
      unannounced_bytes_(buckets_.size(), 0) {
  for (int b = 0; b < num_buckets(); ++b) {
    // Byte ranges locate an announced gradient in its bucket: the bucket must be one dense block.
    TORCH_CHECK(buckets_[b].is_contiguous(), "DP gradient bucket ", b, " is not contiguous");
    TORCH_CHECK(!shard_ || is_trivial(dp_group_) || buckets_[b].numel() % dp_group_->getSize() == 0,
                "DP gradient bucket ", b, " of ", buckets_[b].numel(), " elements does not split into ",
                dp_group_->getSize(), " equal shards");
  }
  TORCH_CHECK(!replica_group_ || is_trivial(replica_group_) || (shard_ && !is_trivial(dp_group_)),
              "DpGradSync: a replica group needs a shard group of two or more ranks");
  TORCH_CHECK(!every_micro_ || !keep_shards_.empty(), "DpGradSync: every_micro accumulates into keep_shards");
  TORCH_CHECK(keep_shards_.empty() || (shard_ && keep_shards_.size() == buckets_.size()),
              "DpGradSync: keep_shards needs shard and one shard tensor per bucket");
  const int64_t size = is_trivial(dp_group_) ? 1 : dp_group_->getSize();
  for (size_t b = 0; b < keep_shards_.size(); ++b) {
    TORCH_CHECK(keep_shards_[b].numel() * size == buckets_[b].numel(), "DpGradSync: bucket ", b, "'s kept shard has ",
                keep_shards_[b].numel(), " elements, not 1/", size, " of ", buckets_[b].numel());
  }
  // Keyed by storage, not address: a released bucket comes back at another address, its storage the same.
  for (int b = 0; b < num_buckets(); ++b) by_storage_[buckets_[b].storage().unsafeGetStorageImpl()] = b;
  clear_step_locked();
}

void DpGradSync::restore() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (every_micro_) {
    // The shards sum the micro-batches' pieces; the buckets come back one by one as the backward writes them
    // (GradBuffer's restore on write).
    for (at::Tensor& shard : keep_shards_) shard.zero_();
    for (at::Tensor& bucket : buckets_) {
      if (bucket.numel() > 0 && !storage_released(bucket)) release_storage(bucket);
    }
    return;
  }
  for (at::Tensor& bucket : buckets_) {
    restore_storage(bucket);
    bucket.zero_();
  }
}

void DpGradSync::keep_shard_and_release(int bucket, const at::Tensor& summed) {
  const int64_t piece = keep_shards_[bucket].numel();
  const int64_t rank = is_trivial(dp_group_) ? 0 : dp_group_->getRank();
  at::Tensor mine = summed.narrow(0, rank * piece, piece);
  if (every_micro_) {
    keep_shards_[bucket].add_(mine);
  } else {
    keep_shards_[bucket].copy_(mine);
  }
  release_storage(buckets_[bucket]);
}

void DpGradSync::rearm_locked(int bucket) {
  launched_[bucket] = false;
  announced_[bucket].clear();
  unannounced_bytes_[bucket] = static_cast<int64_t>(buckets_[bucket].nbytes());
}

void DpGradSync::launch(int bucket, LaunchCause cause) {
  if (bucket < 0 || bucket >= num_buckets()) {
    throw std::out_of_range("DP gradient bucket " + std::to_string(bucket) + " does not exist");
  }
  std::lock_guard<std::mutex> lock(mutex_);
  launch_locked(bucket, cause);
}

void DpGradSync::launch_locked(int bucket, LaunchCause cause) {
  if (launched_[bucket]) return;
  // Per micro-batch, a bucket nothing wrote since its last reduction stays released and is not sent.
  if (every_micro_ && storage_released(buckets_[bucket])) return;
  launched_[bucket] = true;
  launches_.push_back({bucket, cause});
  // On CUDA, c10d's NCCL all-reduce makes its stream wait on the caller's current stream at launch; called
  // from a backward right after the GEMM that wrote the last gradient (same thread, same stream), it is
  // ordered after that write without any synchronisation here.
  if (is_trivial(dp_group_)) {
    if (!keep_shards_.empty()) keep_shard_and_release(bucket, buckets_[bucket]);
    if (every_micro_) rearm_locked(bucket);
    return;
  }
  at::Tensor& grads = buckets_[bucket];
  // The cast runs on the caller's current stream, right after the write that finished the bucket; the
  // all-reduce's stream waits for it like for any other producer.
  at::Tensor wire = wire_dtype_ && *wire_dtype_ != grads.scalar_type() ? grads.to(*wire_dtype_) : at::Tensor();
  at::Tensor& payload = wire.defined() ? wire : grads;
  auto work = shard_ ? reduce_scatter_sum_async(payload, dp_group_) : all_reduce_sum_async(payload, dp_group_);
  if (trace_) {
    trace_->launched(shard_ && has_reduce_scatter(dp_group_) ? CommKind::ReduceScatter : CommKind::AllReduce, bucket,
                     work);
  }
  pending_.push_back({std::move(work), bucket, std::move(wire)});
  complete_finished_locked();
}

void DpGradSync::complete_one(InFlight& f) {
  f.work->wait();  // on CUDA: the current stream waits for the all-reduce, then the cast back follows it
  if (replica_group_ && !is_trivial(replica_group_) && !every_micro_) {
    at::Tensor& summed = f.wire.defined() ? f.wire : buckets_[f.bucket];
    const int64_t piece = summed.numel() / dp_group_->getSize();
    at::Tensor mine = summed.narrow(0, dp_group_->getRank() * piece, piece);
    auto across = all_reduce_sum_async(mine, replica_group_);
    if (trace_) trace_->launched(CommKind::AllReduce, f.bucket, across);
    across->wait();
  }
  if (!keep_shards_.empty()) {
    keep_shard_and_release(f.bucket, f.wire.defined() ? f.wire : buckets_[f.bucket]);
    if (every_micro_) rearm_locked(f.bucket);
  } else if (f.wire.defined()) {
    buckets_[f.bucket].copy_(f.wire);
  }
}

void DpGradSync::complete(std::vector<InFlight>& in_flight) {
  for (InFlight& f : in_flight) complete_one(f);
  in_flight.clear();
}

void DpGradSync::complete_finished_locked() {
  // With replicas, completing a bucket issues its all-reduce across the copies, a blocking collective: that waits
  // for finish(), where no pipeline traffic of the step is left to wait on this rank.
  if (keep_shards_.empty() || (replica_group_ && !is_trivial(replica_group_) && !every_micro_)) return;
  // The finished prefix only, in launch order.
  size_t done = 0;
  while (done < pending_.size() &&
         (pending_.size() - done > kShardedInFlight || pending_[done].work->isCompleted())) {
    complete_one(pending_[done++]);
  }
  pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
}

void DpGradSync::arm(const std::vector<int>& buckets) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (every_micro_) {
    // The backward about to run writes these buckets again: the previous micro-batch's reductions must be done
    // with them (they have run beside the forwards in between).
    complete(pending_);
  }
  for (int b : buckets) {
    if (b < 0 || b >= num_buckets()) {
      throw std::out_of_range("DP gradient bucket " + std::to_string(b) + " does not exist");
    }
    armed_[b] = true;
  }
}

void DpGradSync::disarm() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fill(armed_.begin(), armed_.end(), false);
}

bool DpGradSync::notify(const at::Tensor& grad) {
  if (!grad.defined() || grad.nbytes() == 0 || !grad.is_contiguous() || !grad.has_storage()) return false;
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = by_storage_.find(grad.storage().unsafeGetStorageImpl());
  if (found == by_storage_.end()) return false;
  const int b = found->second;
  if (!armed_[b] || launched_[b] || grad.dtype() != buckets_[b].dtype()) return false;
  // Byte range within the bucket (whose storage starts at its first element).
  const uintptr_t begin = static_cast<uintptr_t>(grad.storage_offset()) * grad.element_size();
  const uintptr_t end = begin + grad.nbytes();
  // Count only ranges disjoint from everything announced before: a gradient announced twice (or overlapping
  // one that was) counts once, so reaching zero means every byte of the bucket was announced final.
  auto& ranges = announced_[b];
  auto next = ranges.lower_bound(begin);
  if (next != ranges.end() && next->first < end) return false;
  if (next != ranges.begin() && std::prev(next)->second > begin) return false;
  ranges.emplace_hint(next, begin, end);
  unannounced_bytes_[b] -= static_cast<int64_t>(end - begin);
  if (unannounced_bytes_[b] > 0) return false;
  // Launch order follows the backward's announcement order, the same program on every DP rank.
  launch_locked(b, LaunchCause::Notified);
  return true;
}

void DpGradSync::finish() {
  std::vector<InFlight> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int b = 0; b < num_buckets(); ++b) launch_locked(b, LaunchCause::Finish);
    pending.swap(pending_);
  }
  complete(pending);
  if (every_micro_ && replica_group_ && !is_trivial(replica_group_)) {
    // The micro-batches' summed pieces, then across the copies once.
    for (int b = 0; b < num_buckets(); ++b) {
      auto across = all_reduce_sum_async(keep_shards_[b], replica_group_);
      if (trace_) trace_->launched(CommKind::AllReduce, b, across);
      across->wait();
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  last_launches_ = std::move(launches_);
  clear_step_locked();
}

void DpGradSync::reset() {
  std::vector<InFlight> pending;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    pending.swap(pending_);
  }
  for (InFlight& f : pending) f.work->wait();  // an aborted step's sums are dropped, not cast back
  std::lock_guard<std::mutex> lock(mutex_);
  clear_step_locked();
}

void DpGradSync::clear_step_locked() {
  std::fill(launched_.begin(), launched_.end(), false);
  std::fill(armed_.begin(), armed_.end(), false);
  launches_.clear();
  for (int b = 0; b < num_buckets(); ++b) {
    announced_[b].clear();
    unannounced_bytes_[b] = static_cast<int64_t>(buckets_[b].nbytes());
  }
}

std::vector<BucketLaunch> DpGradSync::last_step_launches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_launches_;
}

}  // namespace hybrid
