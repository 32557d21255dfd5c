#include "tp/linear_chain.h"

#include <c10/core/GradMode.h>

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace hybrid {

namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using RowRange = std::pair<int64_t, int64_t>;  // [begin, end)

// Equal row chunks, the first ones a row longer when the count does not divide.
std::vector<RowRange> row_chunks(int64_t rows, int chunks) {
  std::vector<RowRange> out;
  const int64_t n = std::max<int64_t>(1, std::min<int64_t>(chunks, rows));
  int64_t begin = 0;
  for (int64_t c = 0; c < n; ++c) {
    const int64_t length = rows / n + (c < rows % n ? 1 : 0);
    out.emplace_back(begin, begin + length);
    begin += length;
  }
  return out;
}

at::Tensor rows_of(const at::Tensor& t, const RowRange& r) { return t.narrow(0, r.first, r.second - r.first); }

bool is_column(LayerKind kind) { return kind == LayerKind::Column || kind == LayerKind::ColumnGather; }

// One collective in flight per row chunk, and what must happen to the chunk once it is done (a Row layer's bias
// and ReLU after the sum, a ColumnGather's reordering of the gathered slices).
class ChunkCollectives {
 public:
  explicit ChunkCollectives(size_t chunks) : pending_(chunks) {}

  void launch(size_t c, WorkPtr work, std::function<void()> finish = {}) {
    ready(c);
    pending_[c] = {std::move(work), std::move(finish)};
  }
  // Chunk c's collective is done and finished: on a device the compute stream waits for it (the host runs on),
  // on the CPU the host waits.
  void ready(size_t c) {
    Pending& p = pending_[c];
    if (p.work) {
      p.work->wait();
      p.work.reset();
    }
    if (p.finish) {
      std::function<void()> finish = std::move(p.finish);
      p.finish = nullptr;
      finish();
    }
  }
  void ready_all() {
    for (size_t c = 0; c < pending_.size(); ++c) ready(c);
  }
  bool any() const {
    return std::any_of(pending_.begin(), pending_.end(), [](const Pending& p) { return p.work || p.finish; });
  }

 private:
  struct Pending {
    WorkPtr work;
    std::function<void()> finish;
  };
  std::vector<Pending> pending_;
};

// y = x W^T + b (+ ReLU): one cuBLASLt call with a bias(+ReLU) epilogue where the backend has it.
at::Tensor dense_forward(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, bool relu) {
  if (b.defined()) {
    if (relu) return at::_addmm_activation(b, h, w.t(), 1, 1, /*use_gelu=*/false);
    return at::addmm(b, h, w.t());
  }
  at::Tensor out = h.mm(w.t());
  return relu ? out.relu_() : out;
}

// The same into `out` (a row chunk of the layer's output).
void dense_forward_into(at::Tensor out, const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, bool relu) {
  if (b.defined() && relu) {
    at::_addmm_activation_out(out, b, h, w.t(), 1, 1, /*use_gelu=*/false);
  } else if (b.defined()) {
    at::addmm_out(out, b, h, w.t());
  } else {
    at::mm_out(out, h, w.t());
    if (relu) out.relu_();
  }
}

// A layer's weight gradients: written at once, or queued to run under the collectives the next layer back
// launches.
class WeightGrads {
 public:
  WeightGrads(GradBuffer& grads, const LinearChain& chain,
              const std::function<size_t(const at::Tensor&)>& first_layer_of)
      : grads_(grads), chain_(chain), first_layer_of_(first_layer_of), defer_(grads.wgrad().defer()) {}

  void queue(size_t layer, at::Tensor input, at::Tensor grad) {
    queued_.push_back({layer, std::move(input), std::move(grad)});
  }
  void write(size_t layer, const at::Tensor& input, const at::Tensor& grad) {
    const ChainLayer& l = chain_.layers()[layer];
    const at::Tensor wt = l.weight.requires_grad() ? l.weight : at::Tensor();
    const at::Tensor bt = l.bias.defined() && l.bias.requires_grad() ? l.bias : at::Tensor();
    if (!wt.defined() && !bt.defined()) return;
    if (defer_) {
      grads_.wgrad().stash({input, grad, wt, bt});
      return;
    }
    // The step's only write of a parameter overwrites it (the buffers were not zeroed); a parameter the chain
    // uses twice is written by its later layer first, then added to.
    const bool first = std::none_of(written_.begin(), written_.end(), [&](const void* p) {
      return (wt.defined() && p == wt.unsafeGetTensorImpl()) || (bt.defined() && p == bt.unsafeGetTensorImpl());
    });
    grads_.accumulate_linear_grads(grad, input, wt, bt, /*overwrite=*/grads_.overwrites() && first);
    for (const at::Tensor& p : {wt, bt}) {
      if (p.defined()) written_.push_back(p.unsafeGetTensorImpl());
    }
    // Written where it lives: if this is the step's last write, the DP collective may start now.
    for (const at::Tensor& p : {wt, bt}) {
      if (p.defined() && first_layer_of_(p) == layer) grads_.grad_final(p);
    }
  }
  void flush() {
    for (const Queued& q : queued_) write(q.layer, q.input, q.grad);
    queued_.clear();
  }

 private:
  struct Queued {
    size_t layer;
    at::Tensor input, grad;
  };
  GradBuffer& grads_;
  const LinearChain& chain_;
  const std::function<size_t(const at::Tensor&)>& first_layer_of_;
  bool defer_;
  std::vector<Queued> queued_;
  std::vector<const void*> written_;  // parameters this backward has written
};

}  // namespace

int ChainChunking::for_rows(int64_t rows, bool has_collectives) const {
  if (!has_collectives || rows <= 1) return 1;
  const int64_t wanted = chunks > 0 ? chunks : 1;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(wanted, rows)));
}

LinearChain::LinearChain(std::vector<ChainLayer> layers, GroupPtr mp_group, ChainChunking chunking,
                         std::shared_ptr<CommTrace> trace)
    : layers_(std::move(layers)),
      mp_group_(std::move(mp_group)),
      chunking_(chunking),
      trace_(std::move(trace)),
      has_collectives_(!is_trivial(mp_group_)) {
  if (layers_.empty()) throw std::invalid_argument("native chain: no layers");
  if (chunking_.chunks < 0) throw std::invalid_argument("native chain: chunks must be >= 0 (0: auto)");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const ChainLayer& l = layers_[i];
    const std::string where = "native chain layer " + std::to_string(i) + ": ";
    if (!l.weight.defined() || l.weight.dim() != 2) throw std::invalid_argument(where + "needs a 2-D weight");
    for (const at::Tensor& p : {l.weight, l.bias}) {
      if (p.defined() && !p.is_leaf()) throw std::invalid_argument(where + "every parameter must be a leaf tensor");
    }
    if (l.kind != LayerKind::Dense && !has_collectives_) {
      throw std::invalid_argument(where + "a tensor-parallel layer needs an MP group of more than one rank");
    }
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    for (const at::Tensor& p : {layers_[i].weight, layers_[i].bias}) {
      if (!p.defined()) continue;
      auto it = std::find_if(first_layer_.begin(), first_layer_.end(),
                             [&](const auto& e) { return e.first == p.unsafeGetTensorImpl(); });
      if (it == first_layer_.end()) {
        first_layer_.emplace_back(p.unsafeGetTensorImpl(), i);
      } else {
        it->second = i;
      }
    }
  }
}

size_t LinearChain::first_layer_of(const at::Tensor& p) const {
  for (const auto& [impl, layer] : first_layer_) {
    if (impl == p.unsafeGetTensorImpl()) return layer;
  }
  return layers_.size();
}

std::string LinearChain::describe() const {
  size_t relus = 0;
  for (const ChainLayer& l : layers_) relus += l.relu;
  const std::string what = relus == layers_.size() ? "Linear+ReLU" : relus == 0 ? "Linear" : "Linear(+ReLU)";
  const std::string layers = std::to_string(layers_.size()) + " layer" + (layers_.size() == 1 ? "" : "s");
  if (!has_collectives_) return what + " chain, " + layers;
  return "tensor-parallel " + what + " chain, mp " + std::to_string(mp_size()) + ", " + layers;
}

at::Tensor LinearChain::forward(const at::Tensor& x, bool recompute, std::vector<at::Tensor>& saved,
                                const std::function<void(size_t layer)>& before_layer) const {
  TORCH_CHECK(x.dim() == 2, "native chain: input must be [rows, features], got ", x.sizes());
  at::NoGradGuard no_grad;
  const int64_t rows = x.size(0);
  const std::vector<RowRange> chunks = row_chunks(rows, chunking_.for_rows(rows, has_collectives_));
  ChunkCollectives pending(chunks.size());
  saved.assign({x});  // a_0 = x, a_{i+1} = layer i's output
  at::Tensor h = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (before_layer) before_layer(i);
    const ChainLayer& l = layers_[i];
    const at::Tensor& w = l.weight;
    const at::Tensor& b = l.bias;
    at::Tensor out;
    if (l.kind == LayerKind::Dense || l.kind == LayerKind::Column) {
      if (!pending.any()) {
        out = dense_forward(h, w, b, l.relu);
      } else {  // the input arrives chunk by chunk: start on each as soon as its collective is done
        out = at::empty({rows, w.size(0)}, h.options());
        for (size_t c = 0; c < chunks.size(); ++c) {
          pending.ready(c);
          dense_forward_into(rows_of(out, chunks[c]), rows_of(h, chunks[c]), w, b, l.relu);
        }
      }
    } else if (l.kind == LayerKind::Row) {
      out = at::empty({rows, w.size(0)}, h.options());
      for (size_t c = 0; c < chunks.size(); ++c) {
        pending.ready(c);
        at::Tensor part = rows_of(out, chunks[c]);
        at::mm_out(part, rows_of(h, chunks[c]), w.t());
        WorkPtr work = all_reduce_sum_async(part, mp_group_);
        if (trace_) trace_->launched(CommKind::AllReduce, static_cast<int>(i), work, CommAxis::MP);
        // After the sum, so the bias counts once, not MP times.
        pending.launch(c, std::move(work), [part, b, relu = l.relu]() mutable {
          if (b.defined()) part.add_(b);
          if (relu) part.relu_();
        });
      }
    } else {  // ColumnGather: every rank's slice of the features, in rank order
      const int64_t p = mp_size();
      const int64_t local = w.size(0);
      out = at::empty({rows, local * p}, h.options());
      for (size_t c = 0; c < chunks.size(); ++c) {
        pending.ready(c);
        const int64_t n = chunks[c].second - chunks[c].first;
        at::Tensor mine = dense_forward(rows_of(h, chunks[c]), w, b, /*relu=*/false).contiguous();
        at::Tensor slices = at::empty({p * n, local}, h.options());  // rank r's slice: rows [r n, (r + 1) n)
        WorkPtr work = mp_group_->_allgather_base(slices, mine);
        if (trace_) trace_->launched(CommKind::AllGather, static_cast<int>(i), work, CommAxis::MP);
        pending.launch(c, std::move(work),
                       [part = rows_of(out, chunks[c]), slices, mine, n, p, local, relu = l.relu]() mutable {
                         part.copy_(slices.view({p, n, local}).permute({1, 0, 2}).reshape({n, p * local}));
                         if (relu) part.relu_();
                       });
      }
    }
    h = out;
    // Recomputation keeps only the stage input; the backward runs the forward again to rebuild the rest. (A
    // kept output still waiting for its collective is finished in place before this returns.)
    if (!recompute) saved.push_back(h);
  }
  pending.ready_all();
  return h;
}

at::Tensor LinearChain::backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, bool recompute,
                                 bool want_input_grad, GradBuffer& grads) const {
  const size_t n = layers_.size();
  TORCH_CHECK(saved.size() == (recompute ? 1 : n + 1), "native chain: ", saved.size(),
              " saved activations do not match the chain's forward");
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> a;
  if (recompute) {
    forward(saved.at(0), /*recompute=*/false, a);
  } else {
    a = std::move(saved);
  }
  const int64_t rows = a[0].size(0);
  const std::vector<RowRange> chunks = row_chunks(rows, chunking_.for_rows(rows, has_collectives_));
  ChunkCollectives pending(chunks.size());
  const std::function<size_t(const at::Tensor&)> first_layer = [this](const at::Tensor& p) {
    return first_layer_of(p);
  };
  WeightGrads wgrads(grads, *this, first_layer);
  // Whether layer k's backward launches collectives: a Column layer's input gradient is a partial sum.
  auto launches = [&](size_t k) {
    return has_collectives_ && is_column(layers_[k].kind) && (k > 0 || want_input_grad);
  };
  at::Tensor g = grad_output;
  for (size_t k = n; k-- > 0;) {
    const ChainLayer& l = layers_[k];
    const at::Tensor& out = a[k + 1];
    const bool need_input_grad = k > 0 || want_input_grad;
    const bool collective = launches(k);
    // The weight gradient waits to run under the collectives the next layer back is about to launch.
    const bool queue_wgrad = !collective && k > 0 && launches(k - 1);
    const int64_t slice = l.kind == LayerKind::ColumnGather ? l.weight.size(0) : 0;
    const int64_t rank = has_collectives_ ? mp_group_->getRank() : 0;
    at::Tensor local;  // the gradient of this layer's own output features
    at::Tensor input_grad;
    if (!pending.any() && !(collective && chunks.size() > 1)) {
      const at::Tensor masked = l.relu ? at::threshold_backward(g, out, 0) : g;
      local = slice ? masked.narrow(1, rank * slice, slice).contiguous() : masked;
      if (!collective && !queue_wgrad) wgrads.write(k, a[k], local);
      if (need_input_grad) input_grad = local.mm(l.weight);
      if (collective) {
        WorkPtr work = all_reduce_sum_async(input_grad, mp_group_);
        if (trace_) trace_->launched(CommKind::AllReduce, static_cast<int>(k), work, CommAxis::MP);
        pending.launch(0, std::move(work));
      }
    } else {  // chunk by chunk: each as soon as its gradient's collective is done
      const at::Tensor masked = l.relu ? at::empty_like(g) : g;
      local = slice ? at::empty({rows, slice}, g.options()) : masked;
      if (need_input_grad) input_grad = at::empty({rows, l.weight.size(1)}, g.options());
      for (size_t c = 0; c < chunks.size(); ++c) {
        pending.ready(c);
        if (l.relu) {
          at::Tensor masked_rows = rows_of(masked, chunks[c]);
          at::threshold_backward_out(masked_rows, rows_of(g, chunks[c]), rows_of(out, chunks[c]), 0);
        }
        if (slice) rows_of(local, chunks[c]).copy_(rows_of(masked, chunks[c]).narrow(1, rank * slice, slice));
        if (!need_input_grad) continue;
        at::Tensor part = rows_of(input_grad, chunks[c]);
        at::mm_out(part, rows_of(local, chunks[c]), l.weight);
        if (collective) {
          WorkPtr work = all_reduce_sum_async(part, mp_group_);
          if (trace_) trace_->launched(CommKind::AllReduce, static_cast<int>(k), work, CommAxis::MP);
          pending.launch(c, std::move(work));
        }
      }
      if (!collective && !queue_wgrad) wgrads.write(k, a[k], local);
    }
    if (queue_wgrad) wgrads.queue(k, a[k], local);
    if (collective) {  // the queued weight gradients and this layer's own run under its collectives
      wgrads.flush();
      wgrads.write(k, a[k], local);
    }
    a[k + 1] = at::Tensor();  // this layer's output is no longer needed
    g = input_grad;
  }
  wgrads.flush();
  pending.ready_all();
  return want_input_grad ? g : at::Tensor();
}

}  // namespace hybrid
