#include "executor/dp_param_gather.h"

#include <c10/util/Exception.h>

#include <iterator>
#include <stdexcept>
#include <string>

#include "executor/buffer_address.h"

namespace hybrid {

DpParamGather::DpParamGather(std::vector<at::Tensor> params, GroupPtr dp_group, std::shared_ptr<CommTrace> trace)
    : params_(std::move(params)), dp_group_(std::move(dp_group)), trace_(std::move(trace)),
      in_flight_(params_.size()) {
  for (int b = 0; b < num_buckets(); ++b) {
    TORCH_CHECK(params_[b].dim() == 1 && params_[b].is_contiguous(), "parameter bucket ", b,
                " must be one flat contiguous buffer");
    TORCH_CHECK(is_trivial(dp_group_) || params_[b].numel() % dp_group_->getSize() == 0, "parameter bucket ", b,
                " of ", params_[b].numel(), " elements does not split into ", dp_group_->getSize(), " equal pieces");
    if (params_[b].nbytes() > 0) by_address_[buffer_address(params_[b])] = b;
  }
}

void DpParamGather::launch(int bucket) {
  if (bucket < 0 || bucket >= num_buckets()) {
    throw std::out_of_range("parameter bucket " + std::to_string(bucket) + " does not exist");
  }
  if (is_trivial(dp_group_)) return;
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!in_flight_[bucket], "parameter bucket ", bucket, " is still being gathered");
  if (count_in_flight_ == 0) waits_.clear();  // a new round
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
  auto it = by_address_.upper_bound(begin);
  if (it == by_address_.begin()) return -1;
  const int b = std::prev(it)->second;
  return begin + t.nbytes() <= buffer_address(params_[b]) + params_[b].nbytes() ? b : -1;
}

}  // namespace hybrid
