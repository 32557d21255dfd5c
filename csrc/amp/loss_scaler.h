// Dynamic loss scaling for fp16 training, agreed across the model-parallel group.
//
// The rule is torch.amp.GradScaler's (`at::_amp_update_scale_`): back off on an overflow, grow after
// `growth_interval` clean steps in a row. Megatron-LM's DynamicGradScaler adds hysteresis and a floor;
// hysteresis defaults to 1 (off) and the floor to 1.0 (Megatron's); above the floor the trajectory is
// GradScaler's bit for bit, and with min_scale=0 it is GradScaler's everywhere.
//
// Hysteresis (Megatron semantics): `hysteresis_tracker` starts at `hysteresis`; every overflow decrements
// it and the scale backs off only once it reaches 0. Clean steps do NOT refill it; only a growth does.
// So with hysteresis=2 the first overflow after a growth (or after the start) is tolerated and every later
// one, consecutive or not, backs off until the scale grows again. Every overflow still resets the growth
// tracker and is still a skipped step: hysteresis delays the backoff, never the skip.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "comm/collectives.h"

namespace hybrid {

struct LossScalerConfig {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // --scale-window: clean steps in a row before the scale grows
  int64_t hysteresis = 1;          // overflows tolerated (since the last growth) before backing off
  // Floor for the scale; 0 means none (GradScaler). Without one a persistent NaN (say, a NaN in the
  // data) halves the scale down to 0 in ~170 steps, after which 1/scale turns every gradient into inf
  // and the run can never recover. Below 1 fp16 has stopped being the problem anyway.
  double min_scale = 1.0;
  bool is_static = false;  // --loss-scale: the scale never changes, non-finite steps are still skipped
};

// Everything that changes during training; plain numbers so a checkpoint can hold it.
struct LossScalerState {
  float scale = 65536.0f;
  int64_t growth_tracker = 0;
  int64_t hysteresis_tracker = 1;
  int64_t consecutive_overflows = 0;
  int64_t skipped_steps = 0;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerConfig config = {});

  // The scale is kept in fp32, as GradScaler keeps it, so that its trajectory matches for any factor.
  double scale() const { return state_.scale; }
  // What the gradients are multiplied by to unscale them, as GradScaler computes it: the reciprocal in fp64
  // (fp32 division can be imprecise under some compile options), then rounded to fp32.
  double inv_scale() const { return static_cast<float>(1.0 / static_cast<double>(state_.scale)); }
  const LossScalerConfig& config() const { return config_; }

  // Multiplies the grads in place by 1/scale with torch's fused AMP kernel (one call per device and
  // dtype; undefined tensors are skipped), then takes the MAX of the inf/NaN flag over `group` so that
  // every rank of the group reaches the same answer. Returns true when the step must be skipped.
  // One host sync. `device` places the flag when this rank has no defined grad (it must still join the
  // collective); by default the flag lives on the first grad's device, else on the CPU.
  bool unscale_and_check(const std::vector<at::Tensor>& grads, const GroupPtr& group,
                         std::optional<at::Device> device = std::nullopt);

  // The check of unscale_and_check without the unscale and without the sync: a float32 [1] flag, 1.0 when
  // some rank of `group` found an inf or NaN in its grads (MAX over the group), on the device that
  // unscale_and_check would use. The grads are only read; the caller applies inv_scale() itself (say,
  // sgd_step_and_cast's inv_scale and skip_if) and reads the flag when it next syncs anyway, for update().
  at::Tensor find_nonfinite(const std::vector<at::Tensor>& grads, const GroupPtr& group,
                            std::optional<at::Device> device = std::nullopt);

  // Advances the scale and the counters after a step (found_inf: the step was skipped).
  void update(bool found_inf);

  int64_t skipped_steps() const { return state_.skipped_steps; }
  int64_t consecutive_overflows() const { return state_.consecutive_overflows; }
  int64_t growth_tracker() const { return state_.growth_tracker; }
  int64_t hysteresis_tracker() const { return state_.hysteresis_tracker; }

  const LossScalerState& state() const { return state_; }
  // In static mode the configured scale wins over the saved one (the scale is configuration there).
  void load_state(const LossScalerState& state);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace hybrid
