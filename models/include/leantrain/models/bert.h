#pragma once
// BERT encoder with the masked-LM head (BERT-base architecture, post-LayerNorm, bidirectional).
// Task kMaskedLM.
//
// Parameter names (named_parameters()), D = d_model, F = d_ff (0 -> 4D), V = vocab_size,
// S = seq_len, Y = type_vocab_size, i = 0 .. n_layer-1:
//   tok_emb.weight             [V,D]   token embedding, also the MLM decoder weight (tied)
//   pos_emb.weight             [S,D]   learned positions
//   type_emb.weight            [Y,D]   token types (type 0 is used everywhere)
//   emb_ln.weight/bias         [D]
//   blocks.i.attn.qkv.weight   [3D,D]  blocks.i.attn.qkv.bias  [3D]  (q,k,v; see attention.h)
//   blocks.i.attn.proj.weight  [D,D]   blocks.i.attn.proj.bias [D]
//   blocks.i.ln1.weight/bias   [D]     (after the attention residual)
//   blocks.i.mlp.fc.weight     [F,D]   blocks.i.mlp.fc.bias    [F]
//   blocks.i.mlp.proj.weight   [D,F]   blocks.i.mlp.proj.bias  [D]
//   blocks.i.ln2.weight/bias   [D]     (after the MLP residual)
//   mlm.dense.weight [D,D]  mlm.dense.bias [D]  mlm.ln.weight/bias [D]  mlm.bias [V]
// No buffers. LayerNorm eps 1e-12 (as BERT). No pooler / next-sentence head.
//
// Forward: ids [B,T] int64 (T <= S), no padding mask (every position attends to every
// position; the attention itself takes a key-padding mask, attention.h) -> x = dropout(emb_ln(tok_emb[ids] + pos_emb[0..T-1] + type_emb[0])); each block:
//   x = ln1(x + dropout(attn(x)))   (bidirectional)
//   x = ln2(x + dropout(mlp(x)))    (exact erf GELU)
// The attention core is cfg.attention's (attention.h: sdpa, the default, or plain).
// MLM head: logits = mlm.ln(gelu(mlm.dense(x))) @ tok_emb^T + mlm.bias, [B,T,V].
// Init: normal(0, 0.02) for Linear and Embedding weights, zero biases (mlm.bias too),
// LayerNorm 1/0.
#include <cstdint>

#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include "leantrain/models/attention.h"
#include "leantrain/models/model.h"

namespace lt::models {

class BertBlockImpl : public BlockImpl {
 public:
  BertBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout,
               AttentionImpl attention = AttentionImpl::kSdpa);
  torch::Tensor forward(const torch::Tensor& x) override;

  std::shared_ptr<SelfAttentionImpl> attn;
  torch::nn::LayerNorm ln1{nullptr};
  std::shared_ptr<FeedForwardImpl> mlp;
  torch::nn::LayerNorm ln2{nullptr};

 private:
  double dropout_;
};

/// The masked-LM head; the decoder weight is the token embedding, passed to forward.
class MLMHeadImpl : public torch::nn::Module {
 public:
  MLMHeadImpl(int64_t d_model, int64_t vocab_size);
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& decoder_weight);
  /// ln(gelu(dense(x))): the head before its decoder.
  torch::Tensor transform(const torch::Tensor& x);

  torch::nn::Linear dense{nullptr};
  torch::nn::LayerNorm ln{nullptr};
  torch::Tensor bias;
};

class Bert : public Model {
 public:
  explicit Bert(const lt::models::ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& input) override;
  torch::Tensor forward_loss(const torch::Tensor& input, const torch::Tensor& target) override;
  Task task() const override { return Task::kMaskedLM; }
  /// "attention <plain | sdpa: kernel>" (SelfAttentionImpl::backend) at seq_len in training.
  std::string compute_note(const c10::Device& device, c10::ScalarType dtype) const override;
  /// The encoder output before the masked-LM head, [B,T,D].
  torch::Tensor hidden(const torch::Tensor& input);
  /// The same, the token embedding's backward adding into the fused head's weight gradient
  /// through `slot` (Note [Tied embedding's gradient added into the head's], lm_loss.cpp).
  torch::Tensor hidden(const torch::Tensor& input, const c10::intrusive_ptr<recompute::TiedGradSlot>& slot);

  torch::nn::Embedding tok_emb{nullptr};
  torch::nn::Embedding pos_emb{nullptr};
  torch::nn::Embedding type_emb{nullptr};
  torch::nn::LayerNorm emb_ln{nullptr};
  std::shared_ptr<MLMHeadImpl> mlm;

 private:
  int64_t seq_len_;
  double dropout_;
};

}  // namespace lt::models
