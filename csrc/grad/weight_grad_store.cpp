#include "grad/weight_grad_store.h"

#include <c10/util/Exception.h>

namespace hybrid {

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

std::vector<WgradKey> WeightGradStore::keys() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<WgradKey> out;
  for (const auto& entry : stash_) out.push_back(entry.first);
  return out;
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

DeferWeightGrads::DeferWeightGrads(WeightGradStore& store, WgradKey key)
    : store_(store), previous_defer_(store.defer()), previous_key_(store.current_key()) {
  store_.set_defer(true);
  store_.begin(key);
}

DeferWeightGrads::~DeferWeightGrads() {
  store_.set_defer(previous_defer_);
  if (previous_key_) {
    store_.begin(*previous_key_);
  } else {
    store_.end();
  }
}

}  // namespace hybrid
