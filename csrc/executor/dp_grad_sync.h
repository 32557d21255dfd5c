// Data-parallel gradient averaging in flat buckets, launched asynchronously as soon as a bucket's
// gradients are final, waited for once at the end of the step.
//
// The engine lays each bucket's parameter gradients out as views into one flat tensor, so autograd (and
// the deferred weight-gradient store) accumulate straight into the buffer that gets all-reduced: no copy in,
// no copy out.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "comm/collectives.h"

namespace hybrid {

class DpGradSync {
 public:
  // buckets[i] is the flat gradient buffer of bucket i; group is the DP group (trivial group: no-op).
  DpGradSync(std::vector<at::Tensor> buckets, GroupPtr dp_group);

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Start the all-reduce of one bucket; each bucket is launched at most once per step.
  void launch(int bucket);
  // Launch whatever has not been launched, wait for all, and divide by the DP size (sum -> mean).
  void finish();
  // Forget launches of an aborted step.
  void reset();

 private:
  std::vector<at::Tensor> buckets_;
  GroupPtr dp_group_;
  std::vector<c10::intrusive_ptr<c10d::Work>> pending_;
  std::vector<bool> launched_;
};

}  // namespace hybrid
