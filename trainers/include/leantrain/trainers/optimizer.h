#pragma once
// The optimizer of a run (train.optimizer), shared by the training loop and the planner's
// probes, and the state it will allocate.
#include <cstdint>
#include <memory>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

#include "leantrain/runtime/config.h"

namespace lt::trainers {

/// torch::optim::AdamW whose step() gives bitwise the same results with temporaries of at
/// most 1 MiB instead of two the size of the largest parameter (Note [Chunked AdamW]).
class ChunkedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

/// AdamW (ChunkedAdamW) or SGD over two groups: weight decay on tensors with >= 2 dimensions only.
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& t, torch::nn::Module& model);

/// Bytes of optimizer state the first update allocates: AdamW keeps two FP32 moments per
/// parameter, SGD one momentum buffer (none without momentum).
int64_t optimizer_state_bytes(const TrainConfig& t, int64_t param_bytes);

/// Bytes the optimizer's state tensors hold now (AdamW moments, SGD momentum buffers): 0
/// before the first update.
int64_t optimizer_state_allocated_bytes(torch::optim::Optimizer& optimizer);

}  // namespace lt::trainers
