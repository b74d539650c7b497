#pragma once
// GPT decoder (GPT-2 architecture, pre-LayerNorm, tied output head). Task kCausalLM.
//
// Parameter names (named_parameters()), D = d_model, F = d_ff (0 -> 4D), V = vocab_size,
// S = seq_len, i = 0 .. n_layer-1:
//   wte.weight                 [V,D]   token embedding, also the output head (tied)
//   wpe.weight                 [S,D]   learned positions
//   blocks.i.ln1.weight/bias   [D]
//   blocks.i.attn.qkv.weight   [3D,D]  blocks.i.attn.qkv.bias  [3D]  (q,k,v; see attention.h)
//   blocks.i.attn.proj.weight  [D,D]   blocks.i.attn.proj.bias [D]
//   blocks.i.ln2.weight/bias   [D]
//   blocks.i.mlp.fc.weight     [F,D]   blocks.i.mlp.fc.bias    [F]
//   blocks.i.mlp.proj.weight   [D,F]   blocks.i.mlp.proj.bias  [D]
//   ln_f.weight/bias           [D]
// No buffers. LayerNorm eps 1e-5. There is no head parameter: logits = ln_f(x) @ wte.weight^T.
//
// Forward: ids [B,T] int64 (T <= S) -> x = dropout(wte[ids] + wpe[0..T-1]); each block:
//   x = x + dropout(attn(ln1(x)))   (causal)
//   x = x + dropout(mlp(ln2(x)))    (GELU tanh approximation, as GPT-2)
// then logits = ln_f(x) @ wte^T, [B,T,V]. Dropout p = cfg.dropout on the embeddings, on the
// attention probabilities and on both residual branches (training only). The attention core
// is cfg.attention's (attention.h: sdpa, the default, or plain); both compute the same
// function.
// Init: normal(0, 0.02) for Linear and Embedding weights, zero biases, LayerNorm 1/0.
#include <cstdint>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/normalization.h>

#include "leantrain/models/attention.h"
#include "leantrain/models/model.h"

namespace lt::models {

class GPTBlockImpl : public BlockImpl {
 public:
  GPTBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout,
               AttentionImpl attention = AttentionImpl::kSdpa);
  torch::Tensor forward(const torch::Tensor& x) override;
  /// The rerun's forward: the MLP's last product is not computed (Note [A unit's last
  /// product is not rerun]).
  torch::Tensor forward_for_gradients(const torch::Tensor& x) override;

  torch::nn::LayerNorm ln1{nullptr};
  std::shared_ptr<SelfAttentionImpl> attn;
  torch::nn::LayerNorm ln2{nullptr};
  std::shared_ptr<FeedForwardImpl> mlp;

 private:
  torch::Tensor run(const torch::Tensor& x, bool output_read);
  double dropout_;
};

class GPT : public Model {
 public:
  explicit GPT(const lt::models::ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::Tensor forward_loss(const torch::Tensor& input, const torch::Tensor& target) override;
  Task task() const override { return Task::kCausalLM; }
  /// "attention <plain | sdpa: kernel>" (SelfAttentionImpl::backend) at seq_len in training.
  std::string compute_note(const c10::Device& device, c10::ScalarType dtype) const override;
  /// The final hidden states ln_f(blocks(embeddings)), [B,T,D].
  torch::Tensor hidden(const torch::Tensor& input);
  /// The same, the token embedding's backward adding into the fused head's weight gradient
  /// through `slot` (Note [Tied embedding's gradient added into the head's], lm_loss.cpp).
  torch::Tensor hidden(const torch::Tensor& input, const c10::intrusive_ptr<recompute::TiedGradSlot>& slot);

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  int64_t seq_len_;
  double dropout_;
};

}  // namespace lt::models
