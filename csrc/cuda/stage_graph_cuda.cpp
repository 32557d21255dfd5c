// The CUDA graph behind a StageGraph (executor/stage_graph.h): captured on a side stream, replayed on the
// caller's current stream.
#include <ATen/cuda/CUDAContextLight.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <memory>
#include <utility>

#include "executor/stage_graph.h"

namespace hybrid {

namespace {

class CudaStageGraph : public StageGraph {
 public:
  CudaStageGraph(const c10::Stream& capture_stream, const StageGraphs::PoolId& pool)
      : stream_(capture_stream), pool_(pool) {}

  void capture(std::function<void()> body) override {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(stream_.device_index());
    // The capture stream first waits for what the compute stream has queued.
    at::cuda::CUDAEvent queued;
    queued.record(current);
    queued.block(stream_);
    {
      c10::cuda::CUDAStreamGuard on_capture_stream(stream_);
      // cuBLAS's workspace for this stream, set before the capture (inside it, it would come from the graph's
      // pool).
      at::cuda::getCurrentCUDABlasHandle();
      at::cuda::getCurrentCUDABlasLtHandle();
      // A pool of its own ({0, 0}), the stage's shared one, or the one of the graph this one follows. Thread-local: the NCCL watchdog may query the
      // events of the P2P and DP collectives still in flight while this thread captures.
      graph_.capture_begin(pool_, cudaStreamCaptureModeThreadLocal);
      try {
        body();
      } catch (...) {
        try {
          graph_.capture_end();
        } catch (...) {  // the body's error is the one to report
        }
        throw;
      }
      graph_.capture_end();
    }
    at::cuda::CUDAEvent captured;
    captured.record(stream_);
    captured.block(current);
  }

  // On the caller's current stream (the executor's compute stream), after the static inputs' copies.
  void replay() override { graph_.replay(); }

  GraphPool pool() override { return graph_.pool(); }

 private:
  c10::cuda::CUDAStream stream_;
  c10::MempoolId_t pool_;
  at::cuda::CUDAGraph graph_;
};

}  // namespace

c10::Stream cuda_capture_stream(const at::Device& device) {
  return c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                      device.has_index() ? device.index() : c10::cuda::current_device());
}

StageGraphs::PoolId cuda_graph_pool() { return at::cuda::graph_pool_handle(); }

void cuda_release_cached_memory() { c10::cuda::CUDACachingAllocator::emptyCache(); }

std::unique_ptr<StageGraph> make_cuda_stage_graph(const c10::Stream& capture_stream, const StageGraphs::PoolId& pool) {
  return std::make_unique<CudaStageGraph>(capture_stream, pool);
}

}  // namespace hybrid
