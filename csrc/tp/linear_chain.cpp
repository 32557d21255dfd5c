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
std::unordered_map<const void*, size_t> first_layer_of(at::TensorList params) {
  std::unordered_map<const void*, size_t> first;
  for (size_t i = params.size(); i-- > 0;) {
    if (params[i].defined()) first[params[i].unsafeGetTensorImpl()] = i / 2;
  }
  return first;
}

bool all_leaves(at::TensorList params) {
  for (const at::Tensor& p : params) {
    if (p.defined() && !p.is_leaf()) return false;
  }
  return true;
}

void check_chain(const at::Tensor& x, at::TensorList params, const std::vector<bool>& relu) {
  TORCH_CHECK(params.size() == 2 * relu.size(), "linear_chain: ", relu.size(), " layers need ", 2 * relu.size(),
              " params, got ", params.size());
  TORCH_CHECK(x.dim() == 2, "linear_chain: input must be [rows, features], got ", x.sizes());
}

// a_0..a_n for the backward: `saved` itself, or (recompute) rebuilt from a_0 without recording a graph.
std::vector<at::Tensor> activations_for_backward(std::vector<at::Tensor> saved, at::TensorList params,
                                                 const std::vector<bool>& relu, bool recompute) {
  if (!recompute) return saved;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> rebuilt{std::move(saved.at(0))};
  for (size_t i = 0; i < relu.size(); ++i) {
    rebuilt.push_back(layer_forward(rebuilt.back(), params[2 * i], params[2 * i + 1], relu[i]));
  }
  return rebuilt;
}

// The backward walk shared by the autograd node and the native path. want[i]: params[i] needs a gradient.
// `returned` (autograd only) receives the gradients that cannot be written where they live (a non-leaf weight,
// a double backward, a parameter without a gradient buffer yet): slot 1 + i for params[i]. Without it every
// gradient is written in place.
at::Tensor walk_back(at::Tensor g, const std::vector<at::Tensor>& a, at::TensorList params,
                     const std::vector<bool>& relu, const std::vector<bool>& want, bool want_input, bool deferrable,
                     bool first_order, variable_list* returned) {
  WeightGradStore& store = WeightGradStore::instance();
  const bool defer = deferrable && store.defer() && first_order;
  const auto first_layer = first_layer_of(params);
  auto announce = [&](const at::Tensor& p, size_t k) {
    if (p.defined() && first_layer.at(p.unsafeGetTensorImpl()) == k) grad_final(p);
  };
  for (size_t k = relu.size(); k-- > 0;) {
    if (relu[k]) g = at::threshold_backward(g, a[k + 1], 0);
    const at::Tensor& w = params[2 * k];
    const at::Tensor& b = params[2 * k + 1];
    const bool want_w = want[2 * k];
    const bool want_b = b.defined() && want[2 * k + 1];
    if (want_w || want_b) {
      at::Tensor wt = want_w ? w : at::Tensor();
      at::Tensor bt = want_b ? b : at::Tensor();
      if (defer) {
        store.stash({a[k].detach(), g.detach(), wt, bt});
      } else if (returned == nullptr ||
                 (deferrable && (find_main_grad(w) != nullptr || (first_order && grads_exist(wt, bt))))) {
        accumulate_linear_grads(g, a[k], wt, bt);
        // Written where it lives: if this is the step's last write, the DP all-reduce may start now.
        announce(wt, k);
        announce(bt, k);
      } else {
        if (want_w) (*returned)[1 + 2 * k] = linear_weight_grad(g, a[k]);
        if (want_b) (*returned)[2 + 2 * k] = linear_bias_grad(g, b);
      }
    }
    if (k > 0 || want_input) g = g.mm(w);
  }
  return want_input ? g : at::Tensor();
}

struct LinearChainFunction : public torch::autograd::Function<LinearChainFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            const std::vector<bool>& relu, bool recompute) {
    std::vector<at::Tensor> saved;
    at::Tensor h = chain_forward(x, params, relu, recompute, saved);
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["recompute"] = recompute;
    ctx->saved_data["n"] = static_cast<int64_t>(relu.size());
    c10::List<bool> relu_list;
    for (bool r : relu) relu_list.push_back(r);
    ctx->saved_data["relu"] = relu_list;
    ctx->saved_data["deferrable"] = all_leaves(params);
    return h;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto n = static_cast<size_t>(ctx->saved_data.at("n").toInt());
    const bool recompute = ctx->saved_data.at("recompute").toBool();
    std::vector<bool> relu;
    for (bool r : ctx->saved_data.at("relu").toBoolList()) relu.push_back(r);
    variable_list saved = ctx->get_saved_variables();
    // saved: the activations (a_0..a_n, or a_0 with recompute), then weight_0, bias_0, ...
    const size_t kept = recompute ? 1 : n + 1;
    std::vector<at::Tensor> params(saved.begin() + kept, saved.end());
    saved.resize(kept);

    // Outputs of backward: grad of x, then one slot per param, then none for the relu and recompute flags.
    variable_list out(3 + 2 * n);
    if (!grads[0].defined()) return out;
    std::vector<bool> want(2 * n);
    for (size_t i = 0; i < 2 * n; ++i) want[i] = ctx->needs_input_grad(1 + i);
    const auto a = activations_for_backward(std::move(saved), params, relu, recompute);
    out[0] = walk_back(grads[0], a, params, relu, want, ctx->needs_input_grad(0),
                       ctx->saved_data.at("deferrable").toBool(), /*first_order=*/!at::GradMode::is_enabled(), &out);
    return out;
  }
};

}  // namespace

at::Tensor chain_forward(const at::Tensor& x, at::TensorList params, const std::vector<bool>& relu, bool recompute,
                         std::vector<at::Tensor>& saved) {
  check_chain(x, params, relu);
  saved.assign({x});  // a_0 = x, a_{i+1} = layer i's output
  at::Tensor h = x;
  for (size_t i = 0; i < relu.size(); ++i) {
    h = layer_forward(h, params[2 * i], params[2 * i + 1], relu[i]);
    // Recomputation keeps only the stage input; the backward runs the forward again to rebuild the rest.
    if (!recompute) saved.push_back(h);
  }
  return h;
}

at::Tensor chain_backward(const at::Tensor& grad_output, std::vector<at::Tensor> saved, at::TensorList params,
                          const std::vector<bool>& relu, bool recompute, bool want_input_grad) {
  TORCH_CHECK(params.size() == 2 * relu.size(), "chain_backward: ", relu.size(), " layers need ",
              2 * relu.size(), " params, got ", params.size());
  TORCH_CHECK(saved.size() == (recompute ? 1 : relu.size() + 1), "chain_backward: ", saved.size(),
              " saved activations do not match the chain's forward");
  at::NoGradGuard no_grad;
  std::vector<bool> want(params.size());
  for (size_t i = 0; i < params.size(); ++i) want[i] = params[i].defined() && params[i].requires_grad();
  const auto a = activations_for_backward(std::move(saved), params, relu, recompute);
  return walk_back(grad_output, a, params, relu, want, want_input_grad, all_leaves(params), /*first_order=*/true,
                   /*returned=*/nullptr);
}

at::Tensor linear_chain(const at::Tensor& x, const std::vector<at::Tensor>& params, const std::vector<bool>& relu,
                        bool recompute) {
  return LinearChainFunction::apply(x, at::TensorList(params), relu, recompute);
}

}  // namespace hybrid
