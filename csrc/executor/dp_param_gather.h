// The distributed optimizer's (ZeRO-1) parameter all-gathers, overlapped with the next step's forward.
//
// Under ZeRO-1 each DP rank updates only its equal piece of every bucket's parameters (the parameters live in flat
// buffers laid out like the gradient buckets, hybrid_engine/optim/zero.py). The update launches one asynchronous,
// in-place all-gather per bucket as soon as that bucket's piece is written, and nothing waits for it then: the
// next forward waits for a bucket only just before the first layer that reads it (Megatron's
// overlap_param_gather), so the gathers of later layers run while earlier layers compute. A wait on a device
// makes the waiting (compute) stream wait for the gather and lets the host run on; on the CPU (gloo) it blocks
// until the gather is done.
//
// Who waits: a native chain before each of its layers (its handle to this object), an autograd stage's layers in
// forward pre-hooks (hybrid_engine/parallel/data_parallel/param_gather.py), and everything else that reads or writes parameters between
// steps (the next update, checkpoints, evaluation, the user's access) through wait_all. One object per engine.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "comm/collectives.h"
#include "comm/comm_trace.h"

namespace hybrid {

// Why a gather was waited for: by the forward just before a layer that reads the bucket, or by wait_all (the
// next update, a checkpoint, an evaluation, the user reading parameters).
enum class GatherWait { BeforeUse = 0, All = 1 };

class DpParamGather {
 public:
  // params[b]: bucket b's flat parameter buffer (1-D, contiguous, numel divisible by the DP size); dp_group: the
  // DP group (trivial: launch does nothing). trace: where launches are recorded for --trace (may be null).
  DpParamGather(std::vector<at::Tensor> params, GroupPtr dp_group, std::shared_ptr<CommTrace> trace = nullptr);

  int num_buckets() const { return static_cast<int>(params_.size()); }
  // Start gathering bucket `bucket` from every DP rank's piece (this rank's piece must be written already, on the
  // calling thread's current stream). A bucket still in flight is an error: wait for it first.
  void launch(int bucket);
  // Wait for one bucket's gather (nothing if none is in flight).
  void wait(int bucket, GatherWait why = GatherWait::BeforeUse);
  // Wait for the gather of the bucket whose buffer holds `param`'s data (nothing for a tensor outside them).
  void wait_for(const at::Tensor& param);
  void wait_all();
  // The buckets in flight (launched, not yet waited for), in bucket order.
  std::vector<int> in_flight() const;
  // The waits that completed the gathers of the latest round (since the first launch after nothing was in
  // flight), in order: which bucket, and why.
  std::vector<std::pair<int, GatherWait>> last_waits() const;

 private:
  int bucket_of(const at::Tensor& t) const;  // -1: not inside one buffer
  void index_address_locked(int bucket);

  std::vector<at::Tensor> params_;
  GroupPtr dp_group_;
  std::shared_ptr<CommTrace> trace_;
  std::map<uintptr_t, int> by_address_;  // buffer start address -> bucket
  std::vector<uintptr_t> address_;       // per bucket, its indexed start address (0: none)

  mutable std::mutex mutex_;
  std::vector<c10::intrusive_ptr<c10d::Work>> in_flight_;  // per bucket; null when none
  int count_in_flight_ = 0;
  std::vector<std::pair<int, GatherWait>> waits_;
};

}  // namespace hybrid
