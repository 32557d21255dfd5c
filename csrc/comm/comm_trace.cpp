#include "comm/comm_trace.h"

#include <ATen/core/ivalue.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace hybrid {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(CommTrace::Clock::now().time_since_epoch()).count();
}

std::shared_ptr<c10::Event> record_on(const c10::Stream& stream) {
  auto event = std::make_shared<c10::Event>(stream.device_type(), c10::EventFlag::BACKEND_DEFAULT);
  event->record(stream);
  return event;
}

}  // namespace

const char* comm_kind_name(CommKind kind) {
  switch (kind) {
    case CommKind::AllReduce:
      return "all_reduce";
    case CommKind::ReduceScatter:
      return "reduce_scatter";
    case CommKind::AllGather:
      return "all_gather";
    case CommKind::SendRecv:
      return "send_recv";
  }
  return "?";
}

const char* comm_axis_name(CommAxis axis) {
  switch (axis) {
    case CommAxis::DP:
      return "dp";
    case CommAxis::MP:
      return "mp";
    case CommAxis::CP:
      return "cp";
  }
  return "?";
}

CommTrace::CommTrace(at::Device device) : device_(device), on_device_(device.type() != c10::DeviceType::CPU) {}

void CommTrace::start_step(Clock::time_point host, std::shared_ptr<c10::Event> device_event) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_host_ = host;
  if (on_device_) {
    previous_step_event_ = step_event_ ? step_event_ : device_event;
    step_event_ = std::move(device_event);
  }
}

void CommTrace::launched(CommKind kind, int bucket, const c10::intrusive_ptr<c10d::Work>& work, CommAxis axis) {
  if (!work) return;  // a trivial group: nothing ran
  Record r{kind, bucket, axis, work, Clock::now(), std::make_shared<std::atomic<int64_t>>(0), nullptr, nullptr};
  if (on_device_) {
    c10::impl::VirtualGuardImpl impl(device_.type());
    const c10::Stream compute = impl.getStream(device_);
    r.start = record_on(compute);
    if (!side_stream_) side_stream_ = impl.getStreamFromGlobalPool(device_, /*isHighPriority=*/false);
    // Work::wait on a device makes the *current* stream wait for the collective: done on the side stream, the
    // event recorded after it marks the collective's end and the compute stream does not wait.
    impl.exchangeStream(*side_stream_);
    work->wait();
    r.end = record_on(*side_stream_);
    impl.exchangeStream(compute);
  } else {
    auto done = r.done_ns;
    work->getFuture()->addCallback([done](c10::ivalue::Future&) { done->store(now_ns()); });
  }
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(r));
}

void CommTrace::completed_on_host(CommKind kind, int bucket, int64_t launch_ns, int64_t done_ns, CommAxis axis) {
  Record r{kind, bucket, axis, {}, Clock::time_point(std::chrono::nanoseconds(launch_ns)),
           std::make_shared<std::atomic<int64_t>>(done_ns), nullptr, nullptr};
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(r));
}

std::vector<CommSpan> CommTrace::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CommSpan> spans;
  std::vector<Record> running;
  const double step_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(step_host_.time_since_epoch()).count();
  double step_us = 0;
  if (on_device_ && step_event_) {
    step_event_->synchronize();
    step_us = previous_step_event_->elapsedTime(*step_event_) * 1e3;  // elapsedTime is in milliseconds
  }
  for (Record& r : records_) {
    if (on_device_ && r.end) {
      if (!step_event_) continue;  // no step to place it on
      r.end->synchronize();
      spans.push_back({r.kind, r.bucket, r.axis, previous_step_event_->elapsedTime(*r.start) * 1e3 - step_us,
                       previous_step_event_->elapsedTime(*r.end) * 1e3 - step_us});
      continue;
    }
    const int64_t done = r.done_ns->load();
    if (done == 0) {
      running.push_back(std::move(r));
      continue;
    }
    const double launch_ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(r.launch.time_since_epoch()).count();
    spans.push_back(
        {r.kind, r.bucket, r.axis, (launch_ns - step_ns) / 1e3, (static_cast<double>(done) - step_ns) / 1e3});
  }
  records_ = std::move(running);
  return spans;
}

}  // namespace hybrid
