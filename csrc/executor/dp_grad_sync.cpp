#include "executor/dp_grad_sync.h"

#include <c10/util/Exception.h>

#include <iterator>
#include <stdexcept>

#include "executor/buffer_address.h"

namespace hybrid {

DpGradSync::DpGradSync(std::vector<at::Tensor> buckets, GroupPtr dp_group,
                       std::optional<at::ScalarType> wire_dtype, bool shard, std::shared_ptr<CommTrace> trace)
    : buckets_(std::move(buckets)),
      dp_group_(std::move(dp_group)),
      wire_dtype_(wire_dtype),
      shard_(shard),
      trace_(std::move(trace)),
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
    if (buckets_[b].nbytes() > 0) by_address_[buffer_address(buckets_[b])] = b;
  }
  clear_step_locked();
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
  launched_[bucket] = true;
  launches_.push_back({bucket, cause});
  // On CUDA, c10d's NCCL all-reduce makes its stream wait on the caller's current stream at launch; called
  // from a backward right after the GEMM that wrote the last gradient (same thread, same stream), it is
  // ordered after that write without any synchronisation here.
  if (is_trivial(dp_group_)) return;
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
}

void DpGradSync::complete(std::vector<InFlight>& in_flight) {
  for (InFlight& f : in_flight) {
    f.work->wait();  // on CUDA: the current stream waits for the all-reduce, then the cast back follows it
    if (f.wire.defined()) buckets_[f.bucket].copy_(f.wire);
  }
  in_flight.clear();
}

void DpGradSync::arm(const std::vector<int>& buckets) {
  std::lock_guard<std::mutex> lock(mutex_);
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

int DpGradSync::bucket_of(uintptr_t begin, uintptr_t end) const {
  auto it = by_address_.upper_bound(begin);
  if (it == by_address_.begin()) return -1;
  const int b = std::prev(it)->second;
  return end <= buffer_address(buckets_[b]) + buckets_[b].nbytes() ? b : -1;
}

bool DpGradSync::notify(const at::Tensor& grad) {
  if (!grad.defined() || grad.nbytes() == 0 || !grad.is_contiguous()) return false;
  const uintptr_t begin = buffer_address(grad);
  const uintptr_t end = begin + grad.nbytes();
  std::lock_guard<std::mutex> lock(mutex_);
  const int b = bucket_of(begin, end);
  if (b < 0 || !armed_[b] || launched_[b]) return false;
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
