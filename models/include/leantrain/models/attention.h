#pragma once
// The pieces GPT and BERT share: multi-head self-attention and the position-wise MLP.
//
// Names (relative to the module):
//   SelfAttention: qkv.weight [3D,D], qkv.bias [3D], proj.weight [D,D], proj.bias [D]
//   FeedForward:   fc.weight [F,D], fc.bias [F], proj.weight [D,F], proj.bias [D]
// Layout of qkv, for a reference implementation: qkv(x) is split along its last dimension into
// q, k, v (D each, in that order); each is viewed as [B,T,H,D/H] and transposed to [B,H,T,D/H]
// (head h owns features h*D/H .. (h+1)*D/H-1). Scores are q k^T / sqrt(D/H), masked to -inf
// above the diagonal when causal, softmax in the input dtype, dropout on the probabilities
// (training only), then merged back to [B,T,D] and projected by proj.
#include <cstdint>
#include <functional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "leantrain/models/model.h"

namespace lt::models {

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(int64_t d_model, int64_t n_head, double attn_dropout, bool causal);
  /// x [B,T,D] -> [B,T,D] (before any residual dropout).
  torch::Tensor forward(const torch::Tensor& x);
  /// The attention core, q, k, v [B,H,T,hd] -> softmax(q k^T / sqrt(hd) [+ causal mask])
  /// (with dropout) @ v, [B,H,T,hd], runs through this region: it holds the [B,H,T,T]
  /// intermediates that dominate activation memory at long sequence lengths while costing
  /// little to recompute. A model marks it (Model::mark_cheap) to have `selective`
  /// recompute it.
  const CheapRegion& core_region() const { return core_region_; }

  torch::nn::Linear qkv{nullptr};
  torch::nn::Linear proj{nullptr};

 private:
  torch::Tensor core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v);

  CheapRegion core_region_;
  int64_t d_model_;
  int64_t n_head_;
  double attn_dropout_;
  bool causal_;
};

class FeedForwardImpl : public torch::nn::Module {
 public:
  /// approximate: "tanh" (GPT-2) or "none" (exact erf GELU, BERT).
  FeedForwardImpl(int64_t d_model, int64_t d_ff, std::string approximate);
  /// x [B,T,D] -> proj(gelu(fc(x))) [B,T,D].
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear fc{nullptr};
  torch::nn::Linear proj{nullptr};

 private:
  std::string approximate_;
};

/// Transformer initialisation: normal(0, std) for every Linear and Embedding weight, zero
/// biases, LayerNorm weight 1 and bias 0, applied to every descendant of m (not m itself,
/// so it can run in a constructor).
void init_transformer_weights(torch::nn::Module& m, double std = 0.02);

}  // namespace lt::models
