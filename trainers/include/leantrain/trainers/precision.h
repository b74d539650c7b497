#pragma once
// Mixed precision: the autocast guard and the dynamic loss scaler. Parameters, the gradients
// the optimizer sees, optimizer state and checkpoints stay FP32; autocast casts per op.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/precision.h"

namespace lt::trainers {

/// Enables autocast for `precision` (bf16 | fp16; fp32 does nothing) on one device type for its
/// lifetime, restoring the previous state after. The dtype is set before enabling.
class AutocastGuard {
 public:
  AutocastGuard(Precision precision, c10::DeviceType device);
  /// precision.mode's text (parse_precision: ConfigError for another).
  AutocastGuard(const std::string& mode, c10::DeviceType device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  c10::DeviceType device_;
  bool active_ = false, prev_enabled_ = false;
  at::ScalarType prev_dtype_ = at::kFloat;
};

/// Throws ConfigError naming precision.mode when `device` cannot run the mode's matmuls
/// (fp16 on some CPUs / LibTorch builds) — said at startup, not mid-run.
void check_precision_supported(Precision precision, const torch::Device& device);
void check_precision_supported(const std::string& mode, const torch::Device& device);

/// A C++ port of torch.amp.GradScaler's semantics (init 2^16, growth 2.0, backoff 0.5,
/// growth interval 2000 by default, all from [precision]): every micro-batch's loss is
/// scaled; once per optimizer step the gradients are unscaled (before clipping) and checked
/// for inf/NaN on every rank; a step with any non-finite gradient is skipped and the scale
/// backs off; after `growth_interval` clean steps it grows. Built on the same ATen kernels
/// GradScaler uses (_amp_foreach_non_finite_check_and_unscale_, _amp_update_scale_).
/// Disabled (identity, never skips) for fp32 and bf16.
class LossScaler {
 public:
  LossScaler(const PrecisionConfig& cfg, bool enabled, const torch::Device& device);

  bool enabled() const { return enabled_; }
  torch::Tensor scale(const torch::Tensor& loss) const;
  /// Unscales the gradients in place; returns true if any is inf/NaN on any rank.
  bool unscale_(const std::vector<torch::Tensor>& params, comm::Communicator& comm);
  /// Grows or backs off the scale after a step (found_inf from unscale_).
  void update(bool found_inf);

  double scale_value() const;
  int64_t growth_tracker() const;
  /// Restores a saved state (resume).
  void load(double scale, int64_t growth_tracker);

 private:
  bool enabled_;
  double growth_factor_, backoff_factor_;
  int64_t growth_interval_;
  torch::Tensor scale_;           // float32 [1]
  torch::Tensor growth_tracker_;  // int32 [1]
};

/// The end of an optimizer step: unscale, inf-check, clip (grad_clip > 0), then step unless
/// a gradient is non-finite; updates the scaler. Returns false when the step was skipped —
/// weights and optimizer state are then untouched.
bool apply_update(torch::optim::Optimizer& optimizer, LossScaler& scaler,
                  const std::vector<torch::Tensor>& params, double grad_clip, comm::Communicator& comm);

}  // namespace lt::trainers
