#include "tp/linear_chain.h"

#include <c10/core/GradMode.h>

#include <unordered_map>

namespace hybrid {

namespace {

at::Tensor layer_forward(const at::Tensor& h, const at::Tensor& w, const at::Tensor& b, bool relu) {
  if (b.defined()) {
    // One cuBLASLt call with a bias(+ReLU) epilogue where the backend has it.
    if (relu) return at::_addmm_activation(b, h, w.t(), 1, 1, /*use_gelu=*/false);
    return at::addmm(b, h, w.t());
  }
  at::Tensor out = h.mm(w.t());
  return relu ? out.relu_() : out;
}

// The lowest layer each parameter appears in: walking back, its gradient is final only after that layer (a
// parameter shared by two layers of the chain is written twice).
// params: weight_0, bias_0, weight_1, ...
std::unordered_map<const void*, size_t> first_layer_of(at::TensorList params) {
  std::unordered_map<const void*, size_t> first;
  for (size_t i = params.size(); i-- > 0;) {
    if (params[i].defined()) first[params[i].unsafeGetTensorImpl()] = i / 2;
  }
  return first;
}

void check_chain(at::TensorList params, const std::vector<bool>& relu, const char* what) {
  TORCH_CHECK(params.size() == 2 * relu.size(), what, ": ", relu.size(), " layers need ", 2 * relu.size(),
              " params, got ", params.size());
  for (const at::Tensor& p : params) {
    TORCH_CHECK(!p.defined() || p.is_leaf(), what, ": every parameter must be a leaf tensor");
  }
}

// a_0..a_n for the backward: `saved` itself, or (recompute) rebuilt from a_0.
std::vector<at::Tensor> activations_for_backward(std::vector<at::Tensor> saved, at::TensorList params,
                                                 const std::vector<bool>& relu, bool recompute) {
  if (!recompute) return saved;
  std::vector<at::Tensor> rebuilt{std::move(saved.at(0))};
  for (size_t i = 0; i < relu.size(); ++i) {
    rebuilt.push_back(layer_forward(rebuilt.back(), params[2 * i], params[2 * i + 1], relu[i]));
  }
  return rebuilt;
}

}  // namespace

at::Tensor chain_forward(const at::Tensor& x, at::TensorList params, const std::vector<bool>& relu, bool recompute,
                         std::vector<at::Tensor>& saved, const std::function<void(size_t layer)>& before_layer) {
  check_chain(params, relu, "chain_forward");
  TORCH_CHECK(x.dim() == 2, "chain_forward: input must be [rows, features], got ", x.sizes());
  at::NoGradGuard no_grad;
  saved.assign({x});  // a_0 = x, a_{i+1} = layer i's output
  at::Tensor h = x;
  for (size_t i = 0; i < relu.size(); ++i) {
    if (before_layer) before_layer(i);
    h = layer_forward(h, params[2 * i], params[2 * i + 1], relu[i]);
    // Recomputation keeps only the stage input; the backward runs the forward again to rebuild the rest.
    if (!recompute) saved.push_back(h);
  }
  return h;
}

at::Tensor chain_backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, at::TensorList params,
                          const std::vector<bool>& relu, bool recompute, bool want_input_grad, GradBuffer& grads) {
  check_chain(params, relu, "chain_backward");
  TORCH_CHECK(saved.size() == (recompute ? 1 : relu.size() + 1), "chain_backward: ", saved.size(),
              " saved activations do not match the chain's forward");
  at::NoGradGuard no_grad;
  const auto a = activations_for_backward(std::move(saved), params, relu, recompute);
  WeightGradStore& store = grads.wgrad();
  const bool defer = store.defer();
  const auto first_layer = first_layer_of(params);
  at::Tensor g = grad_output;
  for (size_t k = relu.size(); k-- > 0;) {
    if (relu[k]) g = at::threshold_backward(g, a[k + 1], 0);
    const at::Tensor& w = params[2 * k];
    const at::Tensor& b = params[2 * k + 1];
    const at::Tensor wt = w.defined() && w.requires_grad() ? w : at::Tensor();
    const at::Tensor bt = b.defined() && b.requires_grad() ? b : at::Tensor();
    if (wt.defined() || bt.defined()) {
      if (defer) {
        store.stash({a[k], g, wt, bt});
      } else {
        grads.accumulate_linear_grads(g, a[k], wt, bt);
        // Written where it lives: if this is the step's last write, the DP collective may start now.
        for (const at::Tensor& p : {wt, bt}) {
          if (p.defined() && first_layer.at(p.unsafeGetTensorImpl()) == k) grads.grad_final(p);
        }
      }
    }
    if (k > 0 || want_input_grad) g = g.mm(w);
  }
  return want_input_grad ? g : at::Tensor();
}

}  // namespace hybrid
