#pragma once
// Multi-layer perceptron classifier over flattened images. Task kClassify.
//
// Parameter names (named_parameters()), I = in_channels * image_size^2, H_i = hidden[i]:
//   blocks.i.fc.weight [H_i, H_{i-1}] (H_{-1} = I), blocks.i.fc.bias [H_i]
//   head.weight [num_classes, H_last], head.bias [num_classes]
// Forward: images [B,C,H,W] (or anything with C*H*W = I elements per sample) -> flatten
// [B,I] -> each block: dropout(relu(fc(x))) (dropout only when cfg.dropout > 0, training
// only) -> head -> [B,num_classes]. Init: the default nn.Linear init.
#include <cstdint>

#include <torch/nn/modules/linear.h>

#include "leantrain/models/model.h"

namespace lt::models {

class MLPBlockImpl : public BlockImpl {
 public:
  MLPBlockImpl(int64_t in, int64_t out, double dropout);
  torch::Tensor forward(const torch::Tensor& x) override;

  torch::nn::Linear fc{nullptr};

 private:
  double dropout_;
};

class MLP : public Model {
 public:
  explicit MLP(const lt::models::ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& input) override;
  Task task() const override { return Task::kClassify; }

  torch::nn::Linear head{nullptr};

 private:
  int64_t in_features_;
};

}  // namespace lt::models
