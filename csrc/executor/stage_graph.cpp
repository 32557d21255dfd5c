#include "executor/stage_graph.h"

#include <stdexcept>
#include <utility>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/stage_graph_cuda.cpp
c10::Stream cuda_capture_stream(const at::Device& device);
StageGraphs::PoolId cuda_graph_pool();
std::unique_ptr<StageGraph> make_cuda_stage_graph(const c10::Stream& capture_stream, const StageGraphs::PoolId& pool);
void cuda_release_cached_memory();
#endif

namespace {

class HostRerunGraph : public StageGraph {
 public:
  void capture(std::function<void()> body) override { body_ = std::move(body); }
  void replay() override { body_(); }

 private:
  std::function<void()> body_;
};

}  // namespace

StageGraphs::StageGraphs(const at::Device& device, bool host_rerun) {
  if (host_rerun) return;
  if (!device.is_cuda()) throw std::invalid_argument("CUDA graphs need a CUDA device, got " + device.str());
#ifdef HYBRID_WITH_CUDA
  capture_stream_ = cuda_capture_stream(device);
  shared_pool_ = cuda_graph_pool();
#else
  throw std::invalid_argument("CUDA graphs need a CUDA build of torch (this one has none)");
#endif
}

void StageGraphs::release_cached_memory() const {
#ifdef HYBRID_WITH_CUDA
  if (capture_stream_) cuda_release_cached_memory();
#endif
}

std::unique_ptr<StageGraph> StageGraphs::make(bool shared) const {
#ifdef HYBRID_WITH_CUDA
  if (capture_stream_) return make_cuda_stage_graph(*capture_stream_, shared ? shared_pool_ : PoolId{0, 0});
#else
  (void)shared;
#endif
  return std::make_unique<HostRerunGraph>();
}

std::unique_ptr<StageGraph> StageGraphs::make_after(StageGraph& first) const {
#ifdef HYBRID_WITH_CUDA
  if (capture_stream_) return make_cuda_stage_graph(*capture_stream_, first.pool());
#else
  (void)first;
#endif
  return std::make_unique<HostRerunGraph>();
}

}  // namespace hybrid
