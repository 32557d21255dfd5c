// A whole pipeline stage of Linear (+ ReLU) layers, run by the executor itself with no autograd at all (the
// native stage program, executor/stage_program.h), on one rank or split Megatron-style over the MP group.
//
// Running a stage layer by layer through Python modules costs tens of microseconds of host time per layer and
// per autograd node; at 128-row micro-batches a layer's GPU work takes about as long, so the host, not the GPU,
// set the pace. Here the forward loops over the layers in C++ (matrix product, bias and ReLU fused where the
// backend can: at::_addmm_activation), and the backward walks them back in one pass on the calling thread: ReLU
// mask, input gradient, and each weight gradient either accumulated where the GradBuffer routes it or stashed for
// a later W action, exactly as hybrid::linear does for one layer.
//
// Tensor parallelism (Shoeybi et al. 2019, https://arxiv.org/abs/1909.08053): a Column layer holds a slice of
// the output features (its input is the full activation, replicated over MP); a Row layer holds a slice of the
// input features (its input is the Column layer's slice) and its partial products are summed over MP, the bias
// added after the sum. One all-reduce per Column/Row pair forward (after the Row GEMM) and one backward (after
// the Column layer's input-gradient GEMM). A ColumnGather layer (an odd last layer) all-gathers its output.
//
// Overlap. The collectives are asynchronous (on NCCL they run on the communicator's own stream; the compute
// stream waits for one only where it reads its result), and a micro-batch's rows are cut into `chunks`: the
// collective of chunk c runs while chunk c+1 is computed, and the next layer starts on chunk c as soon as its
// collective is done. In the backward each layer's weight-gradient GEMM is issued after the next Column layer's
// input-gradient GEMMs have launched their all-reduces, so it runs under them (Megatron's asynchronous gradient
// all-reduce). All MP ranks of a stage run the same chain on the same rows, so they issue the same collectives
// in the same order.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/collectives.h"
#include "comm/comm_trace.h"
#include "grad/grad_buffer.h"

namespace hybrid {

enum class LayerKind : int { Dense = 0, Column = 1, Row = 2, ColumnGather = 3 };

struct ChainLayer {
  // Dense [out, in]; Column and ColumnGather [out / p, in]; Row [out, in / p].
  at::Tensor weight;
  // Undefined: none. Column / ColumnGather: this rank's slice; Row: the whole bias, added once after the sum.
  at::Tensor bias;
  LayerKind kind = LayerKind::Dense;
  bool relu = false;  // ReLU after the layer (after the sum, or the gather)
};

// How a chain splits a micro-batch's rows for overlap: `chunks` row chunks, never more than rows, and one chunk
// without collectives. 0 (auto) is one chunk: on 4 x H200 the split cost more than it hid (config L at mp 2, one
// 1024-row micro-batch: 1 chunk 9.23 ms a step, 2 chunks 9.85, 4 chunks 12.21), the collectives' fixed cost
// and the smaller GEMMs outweighing the overlap; experiments/NOTES.md has the numbers.
struct ChainChunking {
  int chunks = 0;
  int for_rows(int64_t rows, bool has_collectives) const;
};

class LinearChain {
 public:
  // mp_group: the MP group (null or of one: Dense layers only). trace (may be null): where the MP collectives
  // are recorded for --trace.
  LinearChain(std::vector<ChainLayer> layers, GroupPtr mp_group, ChainChunking chunking,
              std::shared_ptr<CommTrace> trace = nullptr);

  // x [rows, features] -> the chain's output; fills `saved` with what backward needs (a_0 = x, a_1, ..., a_n,
  // each layer's output after its collective and ReLU). recompute: keep only a_0 (the backward reruns the
  // forward). before_layer(i), when given, runs just before layer i reads its parameters (ZeRO-1: wait for the
  // bucket's all-gather, no earlier).
  at::Tensor forward(const at::Tensor& x, bool recompute, std::vector<at::Tensor>& saved,
                     const std::function<void(size_t layer)>& before_layer = {}) const;
  // From the gradient of the output: returns the input's gradient (undefined unless want_input_grad). Parameter
  // gradients (for parameters that require one) are stashed for a W action when the buffer's store defers, else
  // accumulated where the buffer routes them and announced final after their last write. Consumes `saved`.
  at::Tensor backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, bool recompute,
                      bool want_input_grad, GradBuffer& grads) const;

  const std::vector<ChainLayer>& layers() const { return layers_; }
  int mp_size() const { return has_collectives_ ? mp_group_->getSize() : 1; }
  const ChainChunking& chunking() const { return chunking_; }
  std::string describe() const;  // "Linear+ReLU chain, 8 layers" or "tensor-parallel Linear+ReLU chain, mp 2, ..."

 private:
  std::vector<ChainLayer> layers_;
  GroupPtr mp_group_;
  ChainChunking chunking_;
  std::shared_ptr<CommTrace> trace_;
  bool has_collectives_ = false;
  // The lowest layer each parameter appears in: walking back, its gradient is final only after that layer.
  std::vector<std::pair<const void*, size_t>> first_layer_;
  size_t first_layer_of(const at::Tensor& p) const;
};

}  // namespace hybrid
