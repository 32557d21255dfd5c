#include "executor/dp_grad_sync.h"

#include <stdexcept>

namespace hybrid {

DpGradSync::DpGradSync(std::vector<at::Tensor> buckets, GroupPtr dp_group)
    : buckets_(std::move(buckets)), dp_group_(std::move(dp_group)), launched_(buckets_.size(), false) {}

void DpGradSync::launch(int bucket) {
  if (bucket < 0 || bucket >= num_buckets()) {
    throw std::out_of_range("DP gradient bucket " + std::to_string(bucket) + " does not exist");
  }
  if (launched_[bucket]) return;
  launched_[bucket] = true;
  auto work = all_reduce_sum_async(buckets_[bucket], dp_group_);
  if (work) pending_.push_back(std::move(work));
}

void DpGradSync::finish() {
  for (int b = 0; b < num_buckets(); ++b) launch(b);
  for (auto& work : pending_) work->wait();
  pending_.clear();
  if (!is_trivial(dp_group_)) {
    const double inv = 1.0 / dp_group_->getSize();
    for (auto& bucket : buckets_) bucket.mul_(inv);
  }
  std::fill(launched_.begin(), launched_.end(), false);
}

void DpGradSync::reset() {
  for (auto& work : pending_) work->wait();
  pending_.clear();
  std::fill(launched_.begin(), launched_.end(), false);
}

}  // namespace hybrid
