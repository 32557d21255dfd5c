#include "tp/weight_grad_store.h"

#include "tp/main_grad.h"

#include <ATen/ExpandUtils.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <unordered_map>

namespace hybrid {

WeightGradStore& WeightGradStore::instance() {
  static WeightGradStore store;
  return store;
}

void WeightGradStore::set_defer(bool defer) {
  std::lock_guard<std::mutex> lock(mutex_);
  defer_ = defer;
}

bool WeightGradStore::defer() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return defer_;
}

void WeightGradStore::begin(WgradKey key) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = key;
}

void WeightGradStore::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  current_.reset();
}

std::optional<WgradKey> WeightGradStore::current_key() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

void WeightGradStore::stash(WgradEntry entry) {
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(current_.has_value(),
              "WeightGradStore: weight gradients are deferred but no (stage, micro) key was begun; "
              "call begin(stage, micro) before the backward");
  stash_[*current_].push_back(std::move(entry));
}

std::vector<WgradEntry> WeightGradStore::take(const std::vector<WgradKey>& keys) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<WgradEntry> entries;
  for (const WgradKey& key : keys) {
    auto it = stash_.find(key);
    if (it == stash_.end()) continue;
    for (WgradEntry& e : it->second) entries.push_back(std::move(e));
    stash_.erase(it);
  }
  return entries;
}

namespace {

// Position of each parameter's last write in a sequence of writes: its gradient is announced final only
// after that one (a parameter shared by two layers gets two writes).
struct LastWrites {
  std::unordered_map<const void*, size_t> last;
  void see(const at::Tensor& p, size_t position) {
    if (p.defined()) last[p.unsafeGetTensorImpl()] = position;
  }
  void announce_if_last(const at::Tensor& p, size_t position) const {
    if (p.defined() && last.at(p.unsafeGetTensorImpl()) == position) grad_final(p);
  }
};

// Records each parameter once, in first-seen order.
struct TouchedParams {
  std::vector<at::Tensor> params;
  std::unordered_map<const void*, size_t> seen;
  void add(const at::Tensor& p) {
    if (p.defined() && seen.emplace(p.unsafeGetTensorImpl(), params.size()).second) params.push_back(p);
  }
};

}  // namespace

std::vector<at::Tensor> WeightGradStore::flush(WgradKey key) {
  std::vector<WgradEntry> entries = take({key});
  LastWrites last;
  for (size_t i = 0; i < entries.size(); ++i) {
    last.see(entries[i].weight, i);
    last.see(entries[i].bias, i);
  }
  TouchedParams touched;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < entries.size(); ++i) {
    const WgradEntry& e = entries[i];
    accumulate_linear_grads(e.grad_output, e.input, e.weight, e.bias);
    last.announce_if_last(e.weight, i);
    last.announce_if_last(e.bias, i);
    touched.add(e.weight);
    touched.add(e.bias);
  }
  return touched.params;
}

std::vector<at::Tensor> WeightGradStore::flush_merged(const std::vector<WgradKey>& keys, bool overwrite) {
  std::vector<WgradEntry> entries = take(keys);
  // Group by (weight, bias) identity, in first-stashed order.
  struct Group {
    at::Tensor weight, bias;
    std::vector<at::Tensor> inputs, grad_outputs;
  };
  std::vector<Group> groups;
  std::map<std::pair<const void*, const void*>, size_t> index;
  for (WgradEntry& e : entries) {
    auto id = std::make_pair<const void*, const void*>(e.weight.defined() ? e.weight.unsafeGetTensorImpl() : nullptr,
                                                       e.bias.defined() ? e.bias.unsafeGetTensorImpl() : nullptr);
    auto [it, inserted] = index.emplace(id, groups.size());
    if (inserted) groups.push_back({e.weight, e.bias, {}, {}});
    Group& g = groups[it->second];
    g.inputs.push_back(std::move(e.input));
    g.grad_outputs.push_back(std::move(e.grad_output));
  }
  entries.clear();

  LastWrites last;
  for (size_t i = 0; i < groups.size(); ++i) {
    last.see(groups[i].weight, i);
    last.see(groups[i].bias, i);
  }
  TouchedParams touched;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < groups.size(); ++i) {
    Group& g = groups[i];
    at::Tensor input = g.inputs.size() == 1 ? g.inputs[0] : at::cat(g.inputs, 0);
    at::Tensor grad_output = g.grad_outputs.size() == 1 ? g.grad_outputs[0] : at::cat(g.grad_outputs, 0);
    g.inputs.clear();
    g.grad_outputs.clear();
    accumulate_linear_grads(grad_output, input, g.weight, g.bias, overwrite);
    last.announce_if_last(g.weight, i);
    last.announce_if_last(g.bias, i);
    touched.add(g.weight);
    touched.add(g.bias);
  }
  return touched.params;
}

std::vector<at::Tensor> WeightGradStore::flush_all() {
  std::vector<WgradKey> keys;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, entries] : stash_) keys.push_back(key);
  }
  TouchedParams touched;
  for (const WgradKey& key : keys) {
    for (const at::Tensor& p : flush(key)) touched.add(p);
  }
  return touched.params;
}

size_t WeightGradStore::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [key, entries] : stash_) n += entries.size();
  return n;
}

size_t WeightGradStore::pending(WgradKey key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = stash_.find(key);
  return it == stash_.end() ? 0 : it->second.size();
}

void WeightGradStore::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  stash_.clear();
  defer_ = false;
  current_.reset();
}

DeferWeightGrads::DeferWeightGrads(WgradKey key) {
  WeightGradStore& store = WeightGradStore::instance();
  previous_defer_ = store.defer();
  previous_key_ = store.current_key();
  store.set_defer(true);
  store.begin(key);
}

DeferWeightGrads::~DeferWeightGrads() {
  WeightGradStore& store = WeightGradStore::instance();
  store.set_defer(previous_defer_);
  if (previous_key_) {
    store.begin(*previous_key_);
  } else {
    store.end();
  }
}

namespace {

struct Listener {
  std::mutex mutex;
  GradFinalListener fn;
  std::atomic<bool> installed{false};  // lets grad_final skip the lock when nobody listens (most actions)
};

Listener& listener() {
  static Listener l;
  return l;
}

}  // namespace

void set_grad_final_listener(GradFinalListener fn) {
  Listener& l = listener();
  std::lock_guard<std::mutex> lock(l.mutex);
  l.installed.store(static_cast<bool>(fn));
  l.fn = std::move(fn);
}

void grad_final(const at::Tensor& param) {
  Listener& l = listener();
  if (!param.defined() || !l.installed.load()) return;
  std::lock_guard<std::mutex> lock(l.mutex);
  if (!l.fn) return;
  const at::Tensor& grad = grad_target(param);
  if (grad.defined()) l.fn(grad);
}

at::Tensor& grad_target(const at::Tensor& param) {
  at::Tensor* main = find_main_grad(param);
  return main ? *main : param.mutable_grad();
}

at::Tensor linear_weight_grad(const at::Tensor& grad_output_2d, const at::Tensor& input_2d) {
  return grad_output_2d.t().mm(input_2d);
}

at::Tensor linear_bias_grad(const at::Tensor& grad_output_2d, const at::Tensor& bias) {
  return at::sum_to(grad_output_2d, bias.sizes());
}

namespace {

// First gradient of a parameter: laid out like the parameter, as AccumulateGrad makes it.
void assign_grad(at::Tensor& target, const at::Tensor& param, at::Tensor grad) {
  if (grad.strides() != param.strides() && param.is_non_overlapping_and_dense()) {
    at::Tensor laid_out = at::empty_strided(param.sizes(), param.strides(), grad.options());
    laid_out.copy_(grad);
    grad = laid_out;
  }
  target = grad;
}

}  // namespace

void accumulate_linear_grads(const at::Tensor& grad_output_2d, const at::Tensor& input_2d, const at::Tensor& weight,
                             const at::Tensor& bias, bool overwrite) {
  if (weight.defined()) {
    at::Tensor& target = grad_target(weight);
    if (target.defined() && overwrite) {
      mm_into(target, grad_output_2d, input_2d);
    } else if (target.defined()) {
      addmm_into(target, grad_output_2d, input_2d);
    } else {
      assign_grad(target, weight, linear_weight_grad(grad_output_2d, input_2d));
    }
  }
  if (bias.defined()) {
    at::Tensor& target = grad_target(bias);
    if (target.defined() && overwrite) {
      bias_grad_into(target, grad_output_2d);
    } else if (target.defined()) {
      add_bias_grad_into(target, grad_output_2d);
    } else {
      assign_grad(target, bias, linear_bias_grad(grad_output_2d, bias));
    }
  }
}

}  // namespace hybrid
