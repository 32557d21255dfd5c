#include "executor/dp_param_gather.h"

#include <c10/util/Exception.h>

#include <iterator>
#include <stdexcept>
#include <string>

#include "executor/buffer_address.h"
#include "grad/released_storage.h"

namespace hybrid {

DpParamGather::DpParamGather(std::vector<at::Tensor> params, GroupPtr dp_group, std::shared_ptr<CommTrace> trace)
    : params_(std::move(params)), dp_group_(std::move(dp_group)), trace_(std::move(trace)),
      in_flight_(params_.size()), address_(params_.size(), 0) {
  for (int b = 0; b < num_buckets(); ++b) {
    TORCH_CHECK(params_[b].dim() == 1 && params_[b].is_contiguous(), "parameter bucket ", b,
                " must be one flat contiguous buffer");
    TORCH_CHECK(is_trivial(dp_group_) || params_[b].numel() % dp_group_->getSize() == 0, "parameter bucket ", b,
                " of ", params_[b].numel(), " elements does not split into ", dp_group_->getSize(), " equal pieces");
    index_address_locked(b);
  }
}

void DpParamGather::index_address_locked(int bucket) {
  auto old = by_address_.find(address_[bucket]);
  if (old != by_address_.end() && old->second == bucket) by_address_.erase(old);
  address_[bucket] = params_[bucket].nbytes() > 0 ? buffer_address(params_[bucket]) : 0;
  if (address_[bucket] != 0) by_address_[address_[bucket]] = bucket;
}

void DpParamGather::launch(int bucket) {
  if (bucket < 0 || bucket >= num_buckets()) {
    throw std::out_of_range("parameter bucket " + std::to_string(bucket) + " does not exist");
  }
  if (is_trivial(dp_group_)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!in_flight_[bucket], "parameter bucket ", bucket, " is still being gathered");
  if (count_in_flight_ == 0) waits_.clear();  // a new round
  index_address_locked(bucket);  // a buffer released and restored between rounds (ZeRO-3) has moved
  // On a device the gather's stream waits for the caller's current stream here: it is ordered after the update
  // that wrote this rank's piece, with no synchronisation.
  auto work = all_gather_in_place_async(params_[bucket], dp_group_);
  if (trace_) trace_->launched(CommKind::AllGather, bucket, work);
  in_flight_[bucket] = std::move(work);
  ++count_in_flight_;
}

void DpParamGather::wait(int bucket, GatherWait why) {
  if (bucket < 0 || bucket >= num_buckets()) return;
  c10::intrusive_ptr<c10d::Work> work;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!in_flight_[bucket]) return;
    work = std::move(in_flight_[bucket]);
    in_flight_[bucket].reset();
    --count_in_flight_;
    waits_.emplace_back(bucket, why);
  }
  work->wait();  // outside the lock: on the CPU this blocks until gloo is done
}

void DpParamGather::wait_for(const at::Tensor& param) {
  if (!param.defined() || param.nbytes() == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_in_flight_ == 0) return;  // the common case: one check, no lookup
  }
  wait(bucket_of(param));
}

void DpParamGather::wait_all() {
  for (int b = 0; b < num_buckets(); ++b) wait(b, GatherWait::All);
}

std::vector<int> DpParamGather::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<int> out;
  for (int b = 0; b < num_buckets(); ++b) {
    if (in_flight_[b]) out.push_back(b);
  }
  return out;
}

std::vector<std::pair<int, GatherWait>> DpParamGather::last_waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_;
}

int DpParamGather::bucket_of(const at::Tensor& t) const {
  const uintptr_t begin = buffer_address(t);
  // A buffer released since it was indexed (ZeRO-3) leaves a stale entry, which a live buffer's new allocation
  // may overlap: skip entries that are not their bucket's current, live address.
  for (auto it = by_address_.upper_bound(begin); it != by_address_.begin();) {
    --it;
    const int b = it->second;
    if (address_[b] != it->first || storage_released(params_[b])) continue;
    return begin + t.nbytes() <= it->first + params_[b].nbytes() ? b : -1;
  }
  return -1;
}

}  // namespace hybrid
