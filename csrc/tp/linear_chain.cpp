#include "tp/linear_chain.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/custom_function.h>

#include <unordered_map>

#include "tp/main_grad.h"
#include "tp/weight_grad_store.h"

namespace hybrid {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor layer_forward(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, bool relu) {
  if (b.defined()) {
    // One cuBLASLt call with a bias(+ReLU) epilogue where the backend has it.
    if (relu) return at::_addmm_activation(b, h, w.t(), 1, 1, /*use_gelu=*/false);
    return at::addmm(b, h, w.t());
  }
  at::Tensor out = h.mm(w.t());
  return relu ? out.relu_() : out;
}

// Whether each gradient the layer owes already has a tensor to add into (the engine's DP bucket views do).
// Then the backward adds into it in place, as AccumulateGrad would, so the gradient is final when this layer
// is done rather than when the whole chain node returns (like the W flush, this skips gradient hooks).
bool grads_exist(const at::Tensor& w, const at::Tensor& b) {
  return (!w.defined() || grad_target(w).defined()) && (!b.defined() || grad_target(b).defined());
}

// The lowest layer each parameter appears in: walking back, its gradient is final only after that layer (a
// parameter shared by two layers of the chain is written twice).
// params: weight_0, bias_0, weight_1, ...
std::unordered_map<const void*, size_t> first_layer_of(at::ArrayRef<at::Tensor> params) {
  std::unordered_map<const void*, size_t> first;
  for (size_t i = params.size(); i-- > 0;) {
    if (params[i].defined()) first[params[i].unsafeGetTensorImpl()] = i / 2;
  }
  return first;
}

struct LinearChainFunction : public torch::autograd::Function<LinearChainFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            const std::vector<bool>& relu, bool recompute) {
    const size_t n = relu.size();
    TORCH_CHECK(params.size() == 2 * n, "linear_chain: ", n, " layers need ", 2 * n, " params, got ", params.size());
    TORCH_CHECK(x.dim() == 2, "linear_chain: input must be [rows, features], got ", x.sizes());
    std::vector<at::Tensor> activations{x};  // a_0 = x, a_{i+1} = layer i's output
    at::Tensor h = x;
    bool deferrable = true;
    for (size_t i = 0; i < n; ++i) {
      const at::Tensor& w = params[2 * i];
      const at::Tensor& b = params[2 * i + 1];
      deferrable = deferrable && w.is_leaf() && (!b.defined() || b.is_leaf());
      h = layer_forward(h, w, b, relu[i]);
      activations.push_back(h);
    }
    // Recomputation keeps only the stage input; the backward runs the forward again to rebuild the rest.
    std::vector<at::Tensor> saved = recompute ? std::vector<at::Tensor>{x} : activations;
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->saved_data["recompute"] = recompute;
    ctx->save_for_backward(saved);
    ctx->saved_data["n"] = static_cast<int64_t>(n);
    c10::List<bool> relu_list;
    for (bool r : relu) relu_list.push_back(r);
    ctx->saved_data["relu"] = relu_list;
    ctx->saved_data["deferrable"] = deferrable;
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto n = static_cast<size_t>(ctx->saved_data.at("n").toInt());
    const c10::List<bool> relu = ctx->saved_data.at("relu").toBoolList();
    const bool deferrable = ctx->saved_data.at("deferrable").toBool();
    variable_list saved = ctx->get_saved_variables();
    if (ctx->saved_data.at("recompute").toBool()) {
      // saved: a_0, then the params; rebuild a_1..a_n without recording a graph.
      at::NoGradGuard no_grad;
      std::vector<at::Tensor> rebuilt{saved[0]};
      for (size_t i = 0; i < n; ++i) {
        rebuilt.push_back(layer_forward(rebuilt.back(), saved[1 + 2 * i], saved[2 + 2 * i], relu.get(i)));
      }
      rebuilt.insert(rebuilt.end(), saved.begin() + 1, saved.end());
      saved = std::move(rebuilt);
    }
    // saved: a_0..a_n, then weight_0, bias_0, ...
    auto activation = [&](size_t i) -> const at::Tensor& { return saved[i]; };
    auto weight = [&](size_t i) -> const at::Tensor& { return saved[n + 1 + 2 * i]; };
    auto bias = [&](size_t i) -> const at::Tensor& { return saved[n + 2 + 2 * i]; };

    // Outputs of backward: grad of x, then one slot per param, then none for the relu and recompute flags.
    variable_list out(3 + 2 * n);
    at::Tensor g = grads[0];
    if (!g.defined()) return out;
    WeightGradStore& store = WeightGradStore::instance();
    const bool first_order = !at::GradMode::is_enabled();
    const bool defer = deferrable && store.defer() && first_order;
    const auto first_layer = first_layer_of(at::ArrayRef<at::Tensor>(saved).slice(n + 1));
    auto announce = [&](const at::Tensor& p, size_t k) {
      if (p.defined() && first_layer.at(p.unsafeGetTensorImpl()) == k) grad_final(p);
    };
    for (size_t k = n; k-- > 0;) {
      if (relu.get(k)) g = at::threshold_backward(g, activation(k + 1), 0);
      const at::Tensor& w = weight(k);
      const at::Tensor& b = bias(k);
      const bool want_w = ctx->needs_input_grad(1 + 2 * k);
      const bool want_b = b.defined() && ctx->needs_input_grad(2 + 2 * k);
      if (want_w || want_b) {
        at::Tensor wt = want_w ? w : at::Tensor();
        at::Tensor bt = want_b ? b : at::Tensor();
        if (defer) {
          store.stash({activation(k).detach(), g.detach(), wt, bt});
        } else if (deferrable && (find_main_grad(w) != nullptr || (first_order && grads_exist(wt, bt)))) {
          accumulate_linear_grads(g, activation(k), wt, bt);
          // Written where it lives: if this is the step's last write, the DP all-reduce may start now.
          announce(wt, k);
          announce(bt, k);
        } else {
          if (want_w) out[1 + 2 * k] = linear_weight_grad(g, activation(k));
          if (want_b) out[2 + 2 * k] = linear_bias_grad(g, b);
        }
      }
      if (k > 0 || ctx->needs_input_grad(0)) g = g.mm(w);
    }
    out[0] = ctx->needs_input_grad(0) ? g : at::Tensor();
    return out;
  }
};

}  // namespace

at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& params, const std::vector<bool>& relu,
                        bool recompute) {
  return LinearChainFunction::apply(x, at::TensorList(params), relu, recompute);
}

}  // namespace hybrid
