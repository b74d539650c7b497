#include "leantrain/trainers/precision.h"

#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cmath>

#include "leantrain/optim/optimizer.h"
#include "leantrain/runtime/errors.h"

namespace lt::trainers {

AutocastGuard::AutocastGuard(Precision precision, c10::DeviceType device) : device_(device) {
  if (precision == Precision::kFp32) return;
  active_ = true;
  prev_enabled_ = at::autocast::is_autocast_enabled(device_);
  prev_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_dtype(device_, compute_dtype(precision));
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::increment_nesting();
}

AutocastGuard::AutocastGuard(const std::string& mode, c10::DeviceType device)
    : AutocastGuard(parse_precision(mode), device) {}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_, prev_enabled_);
  at::autocast::set_autocast_dtype(device_, prev_dtype_);
}

void check_precision_supported(Precision precision, const torch::Device& device) {
  if (precision == Precision::kFp32) return;
  const std::string mode = to_string(precision);
  try {
    auto a = torch::randn({8, 8}, torch::TensorOptions().device(device));
    torch::Tensor y;
    {
      AutocastGuard ac(precision, device.type());
      y = torch::matmul(a, a);
    }
    if (y.scalar_type() != compute_dtype(precision))
      throw std::runtime_error("autocast produced " + std::string(c10::toString(y.scalar_type())));
  } catch (const std::exception& e) {
    std::string msg = e.what();
    msg = msg.substr(0, msg.find('\n'));
    throw ConfigError("precision.mode = '" + mode + "': this LibTorch cannot run " + mode + " matmuls on " +
                      device.str() + " (" + msg + "); use " +
                      (precision == Precision::kFp16 ? "bf16 or fp32" : "fp32"));
  }
}

void check_precision_supported(const std::string& mode, const torch::Device& device) {
  check_precision_supported(parse_precision(mode), device);
}

LossScaler::LossScaler(const PrecisionConfig& cfg, bool enabled, const torch::Device& device)
    : enabled_(enabled),
      growth_factor_(cfg.growth_factor),
      backoff_factor_(cfg.backoff_factor),
      growth_interval_(cfg.growth_interval) {
  scale_ = torch::full({1}, cfg.init_scale, torch::TensorOptions().dtype(torch::kFloat).device(device));
  growth_tracker_ = torch::zeros({1}, torch::TensorOptions().dtype(torch::kInt).device(device));
}

torch::Tensor LossScaler::scale(const torch::Tensor& loss) const {
  return enabled_ ? loss * scale_.to(loss.dtype()) : loss;
}

bool LossScaler::unscale_(const std::vector<torch::Tensor>& params, comm::Communicator& comm) {
  if (!enabled_) return false;
  // As GradScaler: inv_scale = 1/scale computed in double, then rounded to float.
  auto inv_scale = scale_.to(torch::kDouble).reciprocal().to(torch::kFloat);
  auto found_inf = torch::zeros({1}, scale_.options());
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
  // Every rank must agree to skip: sum the flags.
  comm.allreduce_sum(found_inf);
  return found_inf.item<float>() > 0;
}

void LossScaler::update(bool found_inf) {
  if (!enabled_) return;
  auto flag = torch::full({1}, found_inf ? 1.0f : 0.0f, scale_.options());
  at::_amp_update_scale_(scale_, growth_tracker_, flag, growth_factor_, backoff_factor_, growth_interval_);
}

double LossScaler::scale_value() const { return enabled_ ? scale_.item<double>() : 1.0; }
int64_t LossScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void LossScaler::load(double scale, int64_t growth_tracker) {
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

// Note [Fused update]
// With a fused optimizer (FusedAdamW, FusedSGD) the end of a step reads the gradients twice
// instead of five times. The unfused path unscales them in place (read, write), takes their
// norm (read), clips them in place (read, write) and steps (read). Here the norm of the
// still-scaled gradients (one read, _foreach_norm) gives both the inf/NaN check — a
// non-finite gradient makes the norm non-finite — and, divided by the loss scale, the norm
// the clipping needs; the loss scale and the clipping factor then become one divisor that the
// fused kernel applies as it reads each gradient (the grad_scale argument of
// torch.optim.AdamW / SGD(fused=True)). The ranks agree on the skip through the same
// all-reduced flag as before; a skipped step never launches the kernel, so weights, moments,
// momentum buffers and step counts stay untouched. The arithmetic matches GradScaler.unscale_
// + clip_grad_norm_ + AdamW / SGD(fused=True) up to float rounding of the divisor
// (tests/unit/test_optimizer.cpp replays PyTorch's sequence within 1e-6).
namespace {
bool fused_update(optim::ScaledStep& optimizer, LossScaler& scaler, const std::vector<torch::Tensor>& params,
                  double grad_clip, comm::Communicator& comm) {
  const std::vector<torch::Tensor> grads = optimizer.update_gradients(params);
  const double scale = scaler.scale_value();
  double norm = 0.0;  // of the scaled gradients
  if (scaler.enabled() || grad_clip > 0) {
    if (optimizer.sharded()) {
      // This rank's chunks: the squares summed over ranks (Note [Sharded model state]). Every
      // rank takes part, also one whose chunks happen to hold no element.
      auto sq = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble));
      if (!grads.empty())
        // (bf16 gradient sums, memory.grad_accum_dtype: their norms taken in fp32.)
        sq += torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2, torch::kFloat)), 2)
                  .pow(2)
                  .to(torch::kDouble)
                  .cpu();
      comm.allreduce_sum(sq);
      norm = std::sqrt(sq.item<double>());
    } else if (!grads.empty()) {
      norm = torch::linalg_vector_norm(torch::stack(at::_foreach_norm(grads, 2)), 2).item<double>();
    }
  }
  bool found_inf = false;
  if (scaler.enabled()) {
    auto flag = torch::full({1}, std::isfinite(norm) ? 0.0f : 1.0f, torch::TensorOptions().dtype(torch::kFloat));
    comm.allreduce_sum(flag);
    found_inf = flag.item<float>() > 0;
  }
  if (!found_inf) {
    double divisor = scale;
    if (grad_clip > 0) {  // clip_grad_norm_'s factor, on the unscaled norm
      const double coef = grad_clip / (norm / scale + 1e-6);
      if (coef < 1.0) divisor = scale / coef;
    }
    torch::Tensor grad_scale;
    if (divisor != 1.0 && !params.empty())
      grad_scale = torch::full({1}, divisor, torch::TensorOptions().dtype(torch::kFloat).device(params.front().device()));
    optimizer.step_scaled(grad_scale);
  }
  scaler.update(found_inf);
  return !found_inf;
}
}  // namespace

bool apply_update(torch::optim::Optimizer& optimizer, LossScaler& scaler,
                  const std::vector<torch::Tensor>& params, double grad_clip, comm::Communicator& comm) {
  if (auto* fused = dynamic_cast<optim::ScaledStep*>(&optimizer)) return fused_update(*fused, scaler, params, grad_clip, comm);
  const bool found_inf = scaler.unscale_(params, comm);
  if (!found_inf) {
    if (grad_clip > 0) torch::nn::utils::clip_grad_norm_(params, grad_clip);
    optimizer.step();
  }
  scaler.update(found_inf);
  return !found_inf;
}

}  // namespace lt::trainers
