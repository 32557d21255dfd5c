// One piece of a stage's work recorded once and replayed at will: a CUDA graph (its kernels, the tensor-parallel
// collectives among them, captured on a side stream and launched again with one call), or, for tests on a machine
// without a GPU, the host running the recorded body again (it writes where it wrote before, as a replay does).
//
// A CUDA graph gets a memory pool of its own: what one graph allocated and still holds (a micro-batch's saved
// activations) is never handed to another, so graphs may replay in any order. Graphs made `shared` share one pool
// of their StageGraphs instead: for graphs replayed one at a time on one stream whose results are copied or kept
// referenced (their temporaries reuse one another's memory, what each still holds at its capture's end is kept).
// A graph made `after` another captures into that one's pool: it reuses what the first freed and shares its pool
// with no other graph, so what it keeps after a replay stays intact through other graphs' replays until the first
// replays again.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <functional>
#include <memory>
#include <optional>
#include <utility>

namespace hybrid {

using GraphPool = std::pair<unsigned long long, unsigned long long>;  // the CUDA caching allocator's MempoolId_t

class StageGraph {
 public:
  virtual ~StageGraph() = default;
  // Records `body` (a CUDA graph captures its kernels without running them: replay() runs them).
  virtual void capture(std::function<void()> body) = 0;
  virtual void replay() = 0;
  // The memory pool its capture allocated from ({0, 0}: none, the host rerun's).
  virtual GraphPool pool() { return {0, 0}; }
};

// Makes one stage's graphs. Its CUDA graphs are all captured on one side stream, so cuBLAS sets up one workspace
// for them, not one per graph.
class StageGraphs {
 public:
  // CUDA graphs for a CUDA device; the host rerun where `host_rerun` (any device). Throws for CUDA graphs on a
  // build without CUDA or a device that is not CUDA.
  StageGraphs(const at::Device& device, bool host_rerun);
  std::unique_ptr<StageGraph> make(bool shared = false) const;
  // A graph that captures into `first`'s pool, after `first`'s capture; it must replay after `first` each time.
  std::unique_ptr<StageGraph> make_after(StageGraph& first) const;
  // Before a step's captures, at a point where nothing is in flight: the caching allocator's free blocks go back
  // to the device. A capture allocates from its graph's own pool, which cannot take blocks the eager steps left
  // cached, and the allocator frees no cached block while a capture is under way: without this, the graphs' pools
  // come on top of the eager warm-up's cache. Nothing for the host rerun.
  void release_cached_memory() const;

  using PoolId = GraphPool;

 private:
  std::optional<c10::Stream> capture_stream_;  // CUDA graphs only
  PoolId shared_pool_{0, 0};                   // CUDA graphs only: the pool `shared` graphs capture into
};

}  // namespace hybrid
