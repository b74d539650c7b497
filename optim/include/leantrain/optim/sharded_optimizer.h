#pragma once
// The optimizer over the pieces of the parameters this rank updates (memory.shard, ZeRO
// stages 1 and 2: its chunks of the gradient buckets), with AdamW's moments in FP32 or in
// 8 bits (memory.optimizer_state). Unsharded with 8-bit state, the pieces are the whole
// parameters. The same arithmetic as FusedAdamW / FusedSGD (at::_fused_adamw_ /
// at::_fused_sgd_ on 1-D views of the pieces), so a sharded run tracks the unsharded one to
// float rounding; checkpoints hold the full FP32 state per parameter in torch::optim's layout
// (Note [Sharded checkpoints] in the .cpp).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/comm/grad_sync.h"
#include "leantrain/runtime/config.h"
#include "leantrain/optim/optimizer.h"
#include "leantrain/optim/quantized_state.h"

namespace lt::optim {

class ShardedOptimizer : public torch::optim::Optimizer, public ScaledStep {
 public:
  /// `sync`: the run's GradientSync; its stage decides the pieces (kNone: every parameter
  /// whole, gradients read from .grad). `int8_state`: AdamW's moments in 8 bits. Both borrowed.
  ShardedOptimizer(const TrainConfig& t, torch::nn::Module& model, comm::GradientSync& sync, comm::Communicator& comm,
                   bool int8_state);
  ~ShardedOptimizer() override;

  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Updates this rank's pieces, then (sharded) all-gathers the parameters.
  void step_scaled(const torch::Tensor& grad_scale) override;
  std::vector<torch::Tensor> update_gradients(const std::vector<torch::Tensor>& params) const override;
  bool sharded() const override { return sync_.stage() != comm::ShardStage::kNone; }
  bool adamw() const { return adamw_; }
  bool int8_state() const { return int8_; }

  /// Bytes the state holds on this rank now (moments, momentum buffers, 8-bit scales).
  int64_t state_bytes() const;
  /// Whether any state exists (an update ran or a checkpoint was loaded).
  bool has_state() const;

  /// The full FP32 state per parameter, as capture_state writes it for torch::optim
  /// ("<name>/step", "<name>/exp_avg", "<name>/exp_avg_sq"; SGD "<name>/momentum_buffer"),
  /// on `root`; sharded, a collective every rank calls (empty on the others).
  std::vector<checkpoint_io::NamedTensor> full_state(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                                                     int root = 0);
  /// This rank's pieces from full per-parameter state: find(name, key) returns the tensor or
  /// null (a parameter without state starts fresh). CheckpointError for a missing key or a
  /// wrong shape.
  void load_full_state(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                       const std::function<const torch::Tensor*(const std::string&, const std::string&)>& find);

  struct Piece;

 private:
  torch::Tensor piece_grad(const Piece& p) const;

  comm::GradientSync& sync_;
  comm::Communicator& comm_;
  bool adamw_, int8_;
  std::vector<std::unique_ptr<Piece>> pieces_;
};

/// The run's optimizer: make_optimizer's FusedAdamW / FusedSGD when memory.shard is none (or
/// the world is one rank) and the state FP32, else a ShardedOptimizer over `sync`.
std::unique_ptr<torch::optim::Optimizer> make_run_optimizer(const Config& cfg, torch::nn::Module& model,
                                                            comm::GradientSync& sync, comm::Communicator& comm);

}  // namespace lt::optim
