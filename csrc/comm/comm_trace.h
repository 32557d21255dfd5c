// The collectives of a step, for --trace, from launch to completion on the executor's step clock, so that they
// can be drawn beside its compute spans: DP's (every bucket's reduce-scatter or all-reduce, every parameter
// all-gather of the distributed optimizer) and MP's (the all-reduces and all-gathers of native tensor-parallel
// chains, one per layer and row chunk).
//
// Host (CPU, gloo): the launch is the host clock when the collective was issued, the completion the host clock
// when its future completed (gloo completes it on its worker thread): the span is when the collective really ran.
// Device (CUDA, NCCL): the launch is an event on the issuing (compute) stream -- the collective's stream waits for
// that point, so it cannot start earlier -- and the completion an event on a side stream made to wait for the
// collective (Work::wait on that stream), so the compute stream is never held back by the tracing.
//
// One object per traced engine, shared by its DP gradient sync, its parameter gather, its tensor-parallel chains
// and its executor (which starts each step's clock); nothing process-wide.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "comm/collectives.h"

namespace hybrid {

// SendRecv: one hop of context parallelism's ring (this rank's send and its receive from the other neighbour).
enum class CommKind { AllReduce = 0, ReduceScatter = 1, AllGather = 2, SendRecv = 3 };
const char* comm_kind_name(CommKind kind);
// Which group a collective ran on: data parallel (gradient buckets, parameter gathers), model parallel, or context
// parallel (the ring's hops and the K/V gathers of attention, launched from Python: hybrid_engine/parallel/context).
enum class CommAxis { DP = 0, MP = 1, CP = 2 };
const char* comm_axis_name(CommAxis axis);

struct CommSpan {
  CommKind kind = CommKind::AllReduce;
  int bucket = 0;  // DP: the gradient / parameter bucket; MP: the chain layer; CP: the hop within its attention
  CommAxis axis = CommAxis::DP;
  // Microseconds from the step's start; negative: launched before it (the previous update's all-gathers).
  double start_us = 0;
  double end_us = 0;
};

class CommTrace {
 public:
  using Clock = std::chrono::steady_clock;
  explicit CommTrace(at::Device device);

  // A step's clock starts: the executor's origin (its host time; on a device, its event on the compute stream).
  void start_step(Clock::time_point host, std::shared_ptr<c10::Event> device_event);
  // `work`, the collective of `bucket` (MP: of a chain layer), was just issued from the calling thread's current
  // stream.
  void launched(CommKind kind, int bucket, const c10::intrusive_ptr<c10d::Work>& work,
                CommAxis axis = CommAxis::DP);
  // A host transfer timed by its caller (steady-clock ns, Python's time.monotonic_ns): gloo's P2P works have no
  // future to hear their completion from.
  void completed_on_host(CommKind kind, int bucket, int64_t launch_ns, int64_t done_ns, CommAxis axis);
  // The recorded collectives that have completed, relative to the last start_step, in launch order; they are
  // removed (one still running on the host stays for a later call). On a device this waits for their events.
  std::vector<CommSpan> take();

 private:
  struct Record {
    CommKind kind;
    int bucket;
    CommAxis axis;
    c10::intrusive_ptr<c10d::Work> work;
    Clock::time_point launch;
    std::shared_ptr<std::atomic<int64_t>> done_ns;  // host: completion, ns since the clock's epoch; 0 until then
    std::shared_ptr<c10::Event> start, end;         // device
  };

  at::Device device_;
  bool on_device_;
  std::mutex mutex_;
  std::vector<Record> records_;
  Clock::time_point step_host_;
  // Device times are differences of elapsed times from the previous step's start, which precedes every launch
  // still recorded (take() empties the device records each step): no elapsed time is ever negative.
  std::shared_ptr<c10::Event> step_event_, previous_step_event_;
  std::optional<c10::Stream> side_stream_;
};

}  // namespace hybrid
