#pragma once
// The optimizer of a run (train.optimizer), shared by the training loop and the planner's
// probes, and the state it will allocate (leantrain::optim: docs/ARCHITECTURE.md).
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>

#include "leantrain/runtime/config.h"

namespace lt::optim {

/// An optimizer whose update can divide the gradients by a scale inside its kernel.
class ScaledStep {
 public:
  virtual ~ScaledStep() = default;
  /// One update whose kernel divides every gradient by `grad_scale` (float32 [1] on the
  /// parameters' device; undefined: no division) as it reads it: the loss scale and the
  /// clipping factor in one division, no pass over the gradients of its own.
  virtual void step_scaled(const torch::Tensor& grad_scale) = 0;
  /// The gradients the next update reads: by default every defined .grad of `params`;
  /// a sharded optimizer's are this rank's chunks.
  virtual std::vector<torch::Tensor> update_gradients(const std::vector<torch::Tensor>& params) const;
  /// Whether update_gradients() is this rank's share only (their norm is then summed over ranks).
  virtual bool sharded() const { return false; }
};

/// AdamW through ATen's fused kernel, at::_fused_adamw_ (what torch.optim.AdamW(fused=True)
/// runs, on CPU and CUDA): one pass per parameter reads the gradient and updates the weight and
/// both moments, with no temporaries. The state is torch::optim::AdamWParamState (step,
/// exp_avg, exp_avg_sq), so checkpoints and resume are those of torch::optim::AdamW. Results
/// agree with torch.optim.AdamW(fused=True) within float rounding (Note [Fused update],
/// tests/unit/test_optimizer.cpp). amsgrad is refused.
class FusedAdamW : public torch::optim::AdamW, public ScaledStep {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_scaled(const torch::Tensor& grad_scale) override;
};

/// SGD with momentum through ATen's fused kernel, at::_fused_sgd_ (torch.optim.SGD(fused=True)):
/// L2 weight decay, momentum, dampening and Nesterov as torch::optim::SGD, whose state
/// (SGDParamState::momentum_buffer) and checkpoints it keeps.
class FusedSGD : public torch::optim::SGD, public ScaledStep {
 public:
  using torch::optim::SGD::SGD;
  torch::Tensor step(LossClosure closure = nullptr) override;
  void step_scaled(const torch::Tensor& grad_scale) override;
};

/// train.optimizer's two parameter groups: weight decay (train.weight_decay) on tensors with
/// >= 2 dimensions, none on the others; each with the run's options.
std::vector<torch::optim::OptimizerParamGroup> optimizer_groups(const TrainConfig& t, torch::nn::Module& model);

/// AdamW (FusedAdamW) or SGD (FusedSGD) over optimizer_groups().
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& t, torch::nn::Module& model);

/// Bytes of optimizer state the first update allocates: AdamW keeps two FP32 moments per
/// parameter, SGD one momentum buffer (none without momentum).
int64_t optimizer_state_bytes(const TrainConfig& t, int64_t param_bytes);
/// The same for this run's memory.optimizer_state and memory.shard on `world` ranks (one
/// rank's share; 8-bit: ~0.25x of FP32 for tensors of at least kMin8bitNumel elements), for
/// FP32 parameters of `numels` elements each.
int64_t optimizer_state_bytes(const Config& cfg, const std::vector<int64_t>& numels, int world);

/// What model state a rank holds besides the parameters (Note [Budget minimum]).
struct ModelStateBytes {
  int64_t gradients = 0;  // outside the buckets: all of them, or (sharded gradients) the buckets in flight
  int64_t optimizer = 0;  // this rank's share of the optimizer state
  int64_t comm = 0;       // persistent communication buffers: the buckets, or this rank's chunks of them
};
/// For FP32 parameters of `numels` elements each under cfg's memory.shard /
/// memory.optimizer_state on `world` ranks.
ModelStateBytes model_state_bytes(const Config& cfg, const std::vector<int64_t>& numels, int world);
/// The bytes of FP32 parameters of `numels` elements each.
int64_t fp32_bytes(const std::vector<int64_t>& numels);
/// The element counts of a model's parameters.
std::vector<int64_t> parameter_numels(torch::nn::Module& model);

/// Bytes the optimizer's state tensors hold now (AdamW moments, SGD momentum buffers): 0
/// before the first update.
int64_t optimizer_state_allocated_bytes(torch::optim::Optimizer& optimizer);

}  // namespace lt::optim
