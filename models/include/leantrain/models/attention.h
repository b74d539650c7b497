#pragma once
// The pieces GPT and BERT share: multi-head self-attention and the position-wise MLP.
//
// Names (relative to the module):
//   SelfAttention: qkv.weight [3D,D], qkv.bias [3D], proj.weight [D,D], proj.bias [D]
//   FeedForward:   fc.weight [F,D], fc.bias [F], proj.weight [D,F], proj.bias [D]
// Layout of qkv, for a reference implementation: qkv(x) is split along its last dimension into
// q, k, v (D each, in that order); each is viewed as [B,T,H,D/H] and transposed to [B,H,T,D/H]
// (head h owns features h*D/H .. (h+1)*D/H-1). The core is softmax(q k^T / sqrt(D/H) + masks)
// with dropout on the probabilities (training only) @ v, then merged back to [B,T,D] and
// projected by proj. Masks: causal (keys after the query) and an optional key-padding mask
// [B,T] bool, true = a real token that may be attended to, false = padding (Hugging Face's
// attention_mask convention); a masked score is -inf.
//
// Two implementations of the core (model.attention, Note [Attention through SDPA] in
// transformer.cpp):
//   sdpa  at::scaled_dot_product_attention: LibTorch picks the kernel (flash attention,
//         memory-efficient or cuDNN; sdpa_backend says which). The fused kernels keep q, k, v,
//         the output and a [B,H,T] logsumexp for backward instead of the [B,H,T,T]
//         probabilities. Dropout is SDPA's dropout_p. Where no fused kernel takes the inputs
//         (on the CPU: attention dropout > 0) the plain core runs instead of SDPA's math
//         fallback, which would keep the probabilities in fp32 (Note [SDPA's math fallback]).
//   plain softmax(q k^T * (1/sqrt(hd)) [masked_fill -inf]) in the input dtype, dropout
//         (lt::recompute::dropout), @ v: the textbook activations, bitwise the Python
//         reference's plain path (kept for the bitwise reference tests).
#include <cstdint>
#include <functional>
#include <string>

#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include "leantrain/models/model.h"

namespace lt::models {

enum class AttentionImpl { kSdpa, kPlain };

/// "sdpa" | "plain" (model.attention); std::invalid_argument otherwise (the options table
/// checks the key first).
AttentionImpl parse_attention(const std::string& name);
const char* attention_name(AttentionImpl impl);

/// The attention core: q, k, v [B,H,T,hd] -> [B,H,T,hd]. key_padding_mask: undefined, or
/// [B,T] bool (true = attend to this key). dropout_p applies to the probabilities when
/// `train` (plain: lt::recompute::dropout; sdpa: SDPA's dropout_p).
torch::Tensor attention_core(AttentionImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                             const torch::Tensor& v, const torch::Tensor& key_padding_mask, bool causal,
                             double dropout_p, bool train);

/// The kernel at::scaled_dot_product_attention runs for these arguments (at::_fused_sdp_choice,
/// what SDPA itself asks): "flash attention" | "memory-efficient" | "cuDNN" | "math" |
/// "overrideable". For "math" attention_core runs the plain core instead.
std::string sdpa_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& key_padding_mask, bool causal, double dropout_p);

/// Whether SDPA has a fused kernel for these arguments (sdpa_backend is not "math"), i.e.
/// whether attention_core(kSdpa, ...) runs SDPA rather than the plain core.
bool sdpa_runs_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& key_padding_mask, bool causal, double dropout_p);

class SelfAttentionImpl : public torch::nn::Module {
 public:
  SelfAttentionImpl(int64_t d_model, int64_t n_head, double attn_dropout, bool causal,
                    AttentionImpl impl = AttentionImpl::kSdpa);
  /// x [B,T,D] -> [B,T,D] (before any residual dropout). key_padding_mask: undefined or [B,T]
  /// bool, true = a real token (see the top of this file).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& key_padding_mask = {});
  /// The attention core (attention_core) runs through this region when it holds [B,H,T,T]
  /// tensors — the plain core, which "sdpa" also runs where no fused kernel takes the inputs
  /// (attention dropout on the CPU) — which dominate activation memory at long sequence lengths while
  /// costing little to recompute. A model marks it (Model::mark_cheap) to have `selective`
  /// recompute it. A fused SDPA kernel keeps only q, k, v, its output and a logsumexp, all
  /// of which backward needs anyway: it never runs through the region (Note [Selective
  /// recompute under SDPA] in transformer.cpp).
  const CheapRegion& core_region() const { return core_region_; }
  AttentionImpl impl() const { return impl_; }
  /// The kernel the core runs for a batch of `seq_len` tokens on `device` with activations
  /// of `dtype`, in training when `training`: "plain" or "sdpa: <sdpa_backend>".
  std::string backend(const c10::Device& device, c10::ScalarType dtype, int64_t seq_len, bool training) const;

  torch::nn::Linear qkv{nullptr};
  torch::nn::Linear proj{nullptr};

 private:
  CheapRegion core_region_;
  int64_t d_model_;
  int64_t n_head_;
  double attn_dropout_;
  bool causal_;
  AttentionImpl impl_;
};

class FeedForwardImpl : public torch::nn::Module {
 public:
  /// approximate: "tanh" (GPT-2) or "none" (exact erf GELU, BERT).
  FeedForwardImpl(int64_t d_model, int64_t d_ff, std::string approximate);
  /// x [B,T,D] -> proj(gelu(fc(x))) [B,T,D]. In training, GELU's output is not kept for
  /// backward but computed again there from fc's output (Note [GELU recomputed in the MLP's
  /// backward] in transformer.cpp); the values and gradients are bitwise those of the plain
  /// expression.
  torch::Tensor forward(const torch::Tensor& x);
  /// forward(x) where the caller only differentiates the output (a recomputed unit's rerun of a
  /// GPT block, whose MLP output feeds only the block's output: Note [A unit's last product
  /// is not rerun]): the same graph and bitwise the same gradients, but proj's product is not
  /// computed and the output holds zeros.
  torch::Tensor forward_for_gradients(const torch::Tensor& x);

  torch::nn::Linear fc{nullptr};
  torch::nn::Linear proj{nullptr};
  /// false: the plain autograd graph of proj(gelu(h)), which keeps gelu(h) for proj's weight
  /// gradient (what tests and benchmarks compare against).
  bool recompute_gelu = true;

 private:
  std::string approximate_;
};

/// Transformer initialisation: normal(0, std) for every Linear and Embedding weight, zero
/// biases, LayerNorm weight 1 and bias 0, applied to every descendant of m (not m itself,
/// so it can run in a constructor).
void init_transformer_weights(torch::nn::Module& m, double std = 0.02);

}  // namespace lt::models
