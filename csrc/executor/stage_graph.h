// One piece of a stage's work recorded once and replayed at will: a CUDA graph (its kernels, the tensor-parallel
// collectives among them, captured on a side stream and launched again with one call), or, for tests on a machine
// without a GPU, the host running the recorded body again (it writes where it wrote before, as a replay does).
//
// A CUDA graph gets a memory pool of its own: what one graph allocated and still holds (a micro-batch's saved
// activations) is never handed to another, so graphs may replay in any order.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>

namespace hybrid {

class StageGraph {
 public:
  virtual ~StageGraph() = default;
  // Records `body` (a CUDA graph captures its kernels without running them: replay() runs them).
  virtual void capture(std::function<void()> body) = 0;
  virtual void replay() = 0;
};

// Makes one stage's graphs. Its CUDA graphs are all captured on one side stream, so cuBLAS sets up one workspace
// for them, not one per graph.
class StageGraphs {
 public:
  // CUDA graphs for a CUDA device; the host rerun where `host_rerun` (any device). Throws for CUDA graphs on a
  // build without CUDA or a device that is not CUDA.
  StageGraphs(const at::Device& device, bool host_rerun);
  std::unique_ptr<StageGraph> make() const;

 private:
  std::optional<c10::Stream> capture_stream_;  // CUDA graphs only
};

}  // namespace hybrid
