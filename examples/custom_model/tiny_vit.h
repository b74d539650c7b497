#pragma once
// A user's model: a small vision transformer (patch embedding, pre-norm encoder blocks, mean
// pooling, a linear head). Nothing in leantrain knows it; it becomes trainable by deriving
// from lt::models::Model, and recomputable by registering its encoder blocks with add_block:
// memory.recompute = "full" or "every:K" then recomputes them in backward.
#include <torch/torch.h>

#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"

namespace example {

struct TinyVitOptions {
  int64_t image = 16, patch = 4, channels = 1, classes = 4;
  int64_t dim = 64, heads = 4, depth = 4;
};

/// One pre-norm transformer encoder block: x + attn(ln(x)), then x + mlp(ln(x)).
class EncoderBlockImpl : public lt::models::BlockImpl {
 public:
  EncoderBlockImpl(int64_t dim, int64_t heads);
  torch::Tensor forward(const torch::Tensor& x) override;

 private:
  int64_t heads_;
  torch::nn::LayerNorm ln1_{nullptr}, ln2_{nullptr};
  torch::nn::Linear qkv_{nullptr}, proj_{nullptr}, fc_{nullptr}, out_{nullptr};
};

class TinyVit : public lt::models::Model {
 public:
  explicit TinyVit(const TinyVitOptions& o);
  /// images [B, C, H, W] -> logits [B, classes]
  torch::Tensor forward(const torch::Tensor& images) override;
  lt::models::Task task() const override { return lt::models::Task::kClassify; }

 private:
  torch::nn::Conv2d patches_{nullptr};
  torch::Tensor pos_;
  torch::nn::LayerNorm ln_{nullptr};
  torch::nn::Linear head_{nullptr};
};

/// The kind that makes it trainable by name: [model] kind = "tiny_vit", its options table
/// (model.depth = 6 works, model.dpeth = 6 is a config error listing these keys), its input
/// contract and its factory. main() registers it with lt::models::register_model.
lt::models::ModelKind tiny_vit_kind();

}  // namespace example
