// One piece of a stage's work recorded once and replayed at will: a CUDA graph (its kernels, the tensor-parallel
// collectives among them, captured on a side stream and launched again with one call), or, for tests on a machine
// without a GPU, the host running the recorded body again (it writes where it wrote before, as a replay does).
//
// A CUDA graph gets a memory pool of its own: what one graph allocated and still holds (a micro-batch's saved
// activations) is never handed to another, so graphs may replay in any order.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>

namespace hybrid {

class StageGraph {
 public:
  virtual ~StageGraph() = default;
  // Records `body` (a CUDA graph captures its kernels without running them: replay() runs them).
  virtual void capture(std::function<void()> body) = 0;
  virtual void replay() = 0;
};

// A CUDA graph for a CUDA device; the host rerun where `host_rerun` (any device). Throws for a CUDA graph on a
// build without CUDA or a device that is not CUDA.
std::unique_ptr<StageGraph> make_stage_graph(const at::Device& device, bool host_rerun);

}  // namespace hybrid
