#include "executor/stage_graph.h"

#include <stdexcept>
#include <utility>

namespace hybrid {

#ifdef HYBRID_WITH_CUDA
// csrc/cuda/stage_graph_cuda.cpp
std::unique_ptr<StageGraph> make_cuda_stage_graph(const at::Device& device);
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

std::unique_ptr<StageGraph> make_stage_graph(const at::Device& device, bool host_rerun) {
  if (host_rerun) return std::make_unique<HostRerunGraph>();
  if (!device.is_cuda()) throw std::invalid_argument("CUDA graphs need a CUDA device, got " + device.str());
#ifdef HYBRID_WITH_CUDA
  return make_cuda_stage_graph(device);
#else
  throw std::invalid_argument("CUDA graphs need a CUDA build of torch (this one has none)");
#endif
}

}  // namespace hybrid
