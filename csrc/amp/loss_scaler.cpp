#include "amp/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "amp/nonfinite.h"
#include "amp/tensor_groups.h"

namespace hybrid {

namespace {
void check_config(const LossScalerConfig& c) {
  TORCH_CHECK(std::isfinite(c.init_scale) && c.init_scale > 0,
              "loss scale must be a positive finite number, got ", c.init_scale);
  if (c.is_static) return;  // the dynamic knobs below are unused
  TORCH_CHECK(c.growth_factor > 1.0, "loss-scale growth_factor must be > 1, got ", c.growth_factor);
  TORCH_CHECK(c.backoff_factor > 0.0 && c.backoff_factor < 1.0,
              "loss-scale backoff_factor must be in (0, 1), got ", c.backoff_factor);
  TORCH_CHECK(c.growth_interval >= 1, "--scale-window must be >= 1, got ", c.growth_interval);
  TORCH_CHECK(c.hysteresis >= 1, "--hysteresis must be >= 1, got ", c.hysteresis);
  TORCH_CHECK(c.min_scale >= 0.0 && c.min_scale <= c.init_scale,
              "loss-scale min_scale must be in [0, init_scale=", c.init_scale, "], got ", c.min_scale);
}
}  // namespace

DynamicLossScaler::DynamicLossScaler(LossScalerConfig config) : config_(std::move(config)) {
  check_config(config_);
  state_.scale = static_cast<float>(config_.init_scale);
  state_.hysteresis_tracker = config_.hysteresis;
}

bool DynamicLossScaler::unscale_and_check(const std::vector<at::Tensor>& grads, const GroupPtr& group,
                                          std::optional<at::Device> device) {
  const auto buckets = group_by_device_and_dtype(grads);
  const at::Device flag_device = buckets.empty() ? device.value_or(at::Device(at::kCPU)) : buckets[0].device;
  at::Tensor found_inf = at::zeros({1}, at::TensorOptions().dtype(at::kFloat).device(flag_device));

  for (const auto& bucket : buckets) {
    const auto options = at::TensorOptions().dtype(at::kFloat).device(bucket.device);
    at::Tensor inv = at::full({1}, inv_scale(), options);
    if (bucket.device == flag_device) {
      at::_amp_foreach_non_finite_check_and_unscale_(bucket.tensors, found_inf, inv);
    } else {  // a rank whose grads span devices: fold that device's flag in
      at::Tensor flag = at::zeros({1}, options);
      at::_amp_foreach_non_finite_check_and_unscale_(bucket.tensors, flag, inv);
      found_inf.copy_(at::maximum(found_inf, flag.to(flag_device)));
    }
  }
  // Every rank joins, overflowed or not: the decision must be the same on all of them.
  all_reduce_max(found_inf, group);
  return found_inf.item<float>() > 0.0f;
}

at::Tensor DynamicLossScaler::find_nonfinite(const std::vector<at::Tensor>& grads, const GroupPtr& group,
                                             std::optional<at::Device> device) {
  // The flag's device follows unscale_and_check: the first defined grad's, else `device`, else the CPU.
  const auto first = std::find_if(grads.begin(), grads.end(), [](const at::Tensor& t) { return t.defined(); });
  const at::Device flag_device = first != grads.end() ? first->device() : device.value_or(at::Device(at::kCPU));
  at::Tensor found_inf = nonfinite_flag(grads, flag_device);
  // Every rank joins, overflowed or not. On NCCL, waiting on the work only orders the current stream after
  // the collective: the host does not block.
  all_reduce_max(found_inf, group);
  return found_inf;
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    ++state_.skipped_steps;
    ++state_.consecutive_overflows;
  } else {
    state_.consecutive_overflows = 0;
  }
  if (config_.is_static) return;

  // Arithmetic in double, stored in fp32: exactly what at::_amp_update_scale_ does on CPU and CUDA.
  if (found_inf) {
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = std::max<int64_t>(state_.hysteresis_tracker - 1, 0);
    if (state_.hysteresis_tracker == 0) {
      const double backed_off = static_cast<double>(state_.scale) * config_.backoff_factor;
      state_.scale = static_cast<float>(std::max(backed_off, config_.min_scale));
    }
    return;
  }
  // `>=` rather than GradScaler's `==`: a state restored under a smaller --scale-window still grows.
  if (++state_.growth_tracker >= config_.growth_interval) {
    const auto grown = static_cast<float>(static_cast<double>(state_.scale) * config_.growth_factor);
    if (std::isfinite(grown)) state_.scale = grown;  // never grow past fp32 range into inf
    state_.growth_tracker = 0;
    state_.hysteresis_tracker = config_.hysteresis;
  }
}

void DynamicLossScaler::load_state(const LossScalerState& state) {
  TORCH_CHECK(std::isfinite(state.scale) && state.scale > 0.0f,
              "loss scaler state: scale must be positive and finite, got ", state.scale);
  TORCH_CHECK(state.growth_tracker >= 0 && state.hysteresis_tracker >= 0 && state.consecutive_overflows >= 0 &&
                  state.skipped_steps >= 0,
              "loss scaler state: counters must be non-negative");
  const float configured = state_.scale;
  state_ = state;
  if (config_.is_static) state_.scale = configured;
}

}  // namespace hybrid
