#include "grad/grad_buffer.h"

#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <map>

#include "grad/accumulate.h"
#include "grad/released_storage.h"

namespace hybrid {

namespace {

// Position of each parameter's last write in a sequence of writes: its gradient is announced final only
// after that one (a parameter shared by two layers gets two writes).
struct LastWrites {
  std::unordered_map<const void*, size_t> last;
  void see(const at::Tensor& p, size_t position) {
    if (p.defined()) last[p.unsafeGetTensorImpl()] = position;
  }
  bool is_last(const at::Tensor& p, size_t position) const {
    return p.defined() && last.at(p.unsafeGetTensorImpl()) == position;
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

GradBuffer::GradBuffer(std::vector<at::Tensor> buckets) : buckets_(std::move(buckets)) {
  for (const at::Tensor& b : buckets_) {
    TORCH_CHECK(b.defined() && b.dim() == 1 && b.is_contiguous(), "GradBuffer: a bucket must be a flat tensor");
    bucket_of_storage_[b.storage().unsafeGetStorageImpl()] = bucket_of_storage_.size();
  }
}

void GradBuffer::restore_bucket_of(const at::Tensor& grad) {
  if (!grad.defined() || !grad.has_storage()) return;
  auto found = bucket_of_storage_.find(grad.storage().unsafeGetStorageImpl());
  if (found == bucket_of_storage_.end()) return;
  std::lock_guard<std::mutex> lock(restore_mutex_);
  at::Tensor& bucket = buckets_[found->second];
  if (!storage_released(bucket)) return;
  restore_storage(bucket);
  bucket.zero_();
}

std::pair<int64_t, int64_t> GradBuffer::bucket_shard(int bucket, int rank, int size) const {
  TORCH_CHECK(bucket >= 0 && bucket < static_cast<int>(buckets_.size()), "GradBuffer: no bucket ", bucket);
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "GradBuffer: rank ", rank, " of ", size);
  const int64_t numel = buckets_[bucket].numel();
  const int64_t piece = (numel + size - 1) / size;
  const int64_t begin = std::min(numel, piece * rank);
  return {begin, std::min(numel, begin + piece)};
}

void GradBuffer::set_main_grad(const at::Tensor& param, const at::Tensor& buffer) {
  TORCH_CHECK(param.sizes() == buffer.sizes(), "main grad of shape ", buffer.sizes(), " for a parameter of shape ",
              param.sizes());
  std::lock_guard<std::mutex> lock(routes_mutex_);
  main_grads_[param.unsafeGetTensorImpl()] = {param, buffer};
}

bool GradBuffer::has_main_grad(const at::Tensor& param) const {
  std::lock_guard<std::mutex> lock(routes_mutex_);
  return main_grads_.count(param.unsafeGetTensorImpl()) > 0;
}

at::Tensor& GradBuffer::grad_target(const at::Tensor& param) {
  at::Tensor* target = nullptr;
  {
    std::lock_guard<std::mutex> lock(routes_mutex_);
    auto it = main_grads_.find(param.unsafeGetTensorImpl());
    if (it != main_grads_.end()) target = &it->second.second;  // the map's nodes never move
  }
  if (target == nullptr) target = &param.mutable_grad();
  if (restore_on_write_.load()) restore_bucket_of(*target);
  return *target;
}

void GradBuffer::accumulate_linear_grads(const at::Tensor& grad_output_2d, const at::Tensor& input_2d,
                                         const at::Tensor& weight, const at::Tensor& bias, bool overwrite) {
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

std::vector<at::Tensor> GradBuffer::write_weight_grads(size_t count, const WriteFn& write, bool overwrite) {
  LastWrites last;
  for (size_t i = 0; i < count; ++i) {
    last.see(write(i, /*just_params=*/true).weight, i);
    last.see(write(i, /*just_params=*/true).bias, i);
  }
  TouchedParams touched;
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < count; ++i) {
    const WgradEntry w = write(i, /*just_params=*/false);  // built here, freed before the next write
    accumulate_linear_grads(w.grad_output, w.input, w.weight, w.bias, overwrite);
    for (const at::Tensor& p : {w.weight, w.bias}) {
      if (last.is_last(p, i)) grad_final(p);
      touched.add(p);
    }
  }
  return touched.params;
}

std::vector<at::Tensor> GradBuffer::flush(WgradKey key) { return flush_entries(wgrad_.take({key})); }

std::vector<at::Tensor> GradBuffer::flush_entries(std::vector<WgradEntry> entries) {
  return write_weight_grads(
      entries.size(),
      [&entries](size_t i, bool just_params) {
        WgradEntry& e = entries[i];
        return just_params ? WgradEntry{{}, {}, e.weight, e.bias} : std::move(e);
      },
      false);
}

std::vector<at::Tensor> GradBuffer::flush_merged(const std::vector<WgradKey>& keys, bool overwrite) {
  std::vector<WgradEntry> entries = wgrad_.take(keys);
  // Group by (weight, bias) identity, in first-stashed order; each group's rows become one GEMM's K dimension.
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
  // One group's rows are concatenated just before its GEMM and its stashes dropped with it: at most one extra
  // copy is alive at a time.
  return write_weight_grads(
      groups.size(),
      [&groups](size_t i, bool just_params) {
        Group& g = groups[i];
        if (just_params) return WgradEntry{{}, {}, g.weight, g.bias};
        WgradEntry w{g.inputs.size() == 1 ? g.inputs[0] : at::cat(g.inputs, 0),
                     g.grad_outputs.size() == 1 ? g.grad_outputs[0] : at::cat(g.grad_outputs, 0), g.weight, g.bias};
        g.inputs.clear();
        g.grad_outputs.clear();
        return w;
      },
      overwrite);
}

std::vector<at::Tensor> GradBuffer::flush_all() {
  TouchedParams touched;
  for (const WgradKey& key : wgrad_.keys()) {
    for (const at::Tensor& p : flush(key)) touched.add(p);
  }
  return touched.params;
}

void GradBuffer::set_grad_final_listener(GradFinalListener listener) {
  std::lock_guard<std::mutex> lock(listener_mutex_);
  listening_.store(static_cast<bool>(listener));
  listener_ = std::move(listener);
}

void GradBuffer::set_grad_final_muted(bool muted, std::vector<at::Tensor>* record) {
  std::lock_guard<std::mutex> lock(listener_mutex_);
  muted_.store(muted);
  muted_record_ = muted ? record : nullptr;
}

void GradBuffer::grad_final(const at::Tensor& param) {
  if (!param.defined()) return;
  if (muted_.load()) {
    std::lock_guard<std::mutex> lock(listener_mutex_);
    if (muted_record_ != nullptr) muted_record_->push_back(param);
    return;
  }
  if (!listening_.load()) return;
  std::lock_guard<std::mutex> lock(listener_mutex_);
  if (!listener_) return;
  const at::Tensor* grad = nullptr;
  {
    std::lock_guard<std::mutex> routes(routes_mutex_);
    auto it = main_grads_.find(param.unsafeGetTensorImpl());
    if (it != main_grads_.end()) grad = &it->second.second;
  }
  if (grad == nullptr) grad = &param.grad();
  // A bucket already reduced and released (per micro-batch) has nothing left to announce.
  if (grad->defined() && !storage_released(*grad)) listener_(*grad);
}

}  // namespace hybrid
