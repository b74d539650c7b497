#pragma once
// The Llama-family decoder: one class for Llama 3.x, Qwen2.5, Qwen3, Mistral and SmolLM2
// (LitGPT-style: one options table whose switches pick the layers, not a class per family).
// Task kCausalLM. Options (LlamaConfig) are named as Hugging Face's config.json names them.
//
// Parameter names (named_parameters(), in this order), D = hidden_size, F = intermediate_size,
// V = vocab_size, H = num_attention_heads, K = num_key_value_heads (0 -> H), h = head_dim
// (0 -> D / H), i = 0 .. num_hidden_layers-1:
//   embed_tokens.weight                          [V,D]
//   blocks.i.input_layernorm.weight              [D]
//   blocks.i.self_attn.q_proj.weight             [H*h,D]  (+ .bias [H*h] when attention_bias)
//   blocks.i.self_attn.k_proj.weight             [K*h,D]  (+ .bias [K*h] when attention_bias)
//   blocks.i.self_attn.v_proj.weight             [K*h,D]  (+ .bias [K*h] when attention_bias)
//   blocks.i.self_attn.o_proj.weight             [D,H*h]  (never a bias: Qwen2's convention)
//   blocks.i.self_attn.q_norm.weight             [h]      (qk_norm only)
//   blocks.i.self_attn.k_norm.weight             [h]      (qk_norm only)
//   blocks.i.post_attention_layernorm.weight     [D]
//   blocks.i.mlp.gate_proj.weight                [F,D]
//   blocks.i.mlp.up_proj.weight                  [F,D]
//   blocks.i.mlp.down_proj.weight                [D,F]
//   norm.weight                                  [D]
//   lm_head.weight                               [V,D]    (absent when tie_word_embeddings:
//                                                          the head is embed_tokens.weight)
// A Hugging Face name maps by model.layers.i. -> blocks.i., model.embed_tokens -> embed_tokens,
// model.norm -> norm, lm_head -> lm_head. No buffers: the RoPE cos/sin tables are computed on
// first use per device and dtype and cached outside the module state (never in a checkpoint).
//
// Forward, as transformers' modeling_llama.py / modeling_qwen2.py / modeling_qwen3.py /
// modeling_mistral.py: ids [B,T] int64 (T <= seq_len) -> x = embed_tokens[ids]; each block:
//   x = x + dropout(self_attn(input_layernorm(x)))
//   x = x + dropout(mlp(post_attention_layernorm(x)))
// then logits = norm(x) @ W^T, W = lm_head.weight (embed_tokens.weight when tied), [B,T,V].
//   RMSNorm(x) = weight * (x32 * rsqrt(mean(x32^2, -1) + rms_norm_eps)).to(x.dtype), x32 = x in
//     fp32 (Hugging Face's LlamaRMSNorm, same ops; backward recomputes the normalised x from x
//     and the saved [..,1] rsqrt instead of keeping it: Note [RMSNorm keeps its input and rsqrt]).
//   self_attn: q = q_proj(x), k = k_proj(x), v = v_proj(x) viewed [B,T,heads,h]; qk_norm: q =
//     q_norm(q), k = k_norm(k) (RMSNorm over h); RoPE on q and k at positions 0..T-1 with
//     Hugging Face's half rotation, q*cos + rotate_half(q)*sin, rotate_half(q) = cat(-q2, q1)
//     (no q/k permutation of the stored weights), cos/sin = cos/sin(cat(f, f)), f = t *
//     inv_freq[j], inv_freq[j] = 1 / rope_theta^(2j/h) in fp32 (llama3 scaling of inv_freq when
//     rope_scaling = "llama3": rope_inv_freq); causal softmax(q k^T / sqrt(h)) v with each of
//     the K key/value heads shared by H/K query heads (grouped-query attention), dropout p on
//     the probabilities in training; heads merged to [B,T,H*h]; o_proj.
//   mlp: down_proj(silu(gate_proj(x)) * up_proj(x)) (SwiGLU). In training neither silu(gate)
//     nor the product [B,T,F] is kept for backward: they are computed again there from the
//     gate and up outputs (Note [SwiGLU recomputed in the MLP's backward] in llama_layers.cpp).
// Dropout p = dropout on the attention probabilities and on both residual branches (training
// only; Hugging Face's attention_dropout is the probabilities' alone; there is no embedding
// dropout). The attention core is `attention`'s (attention.h): sdpa runs
// at::scaled_dot_product_attention with enable_gqa (k and v are not repeated) where a fused
// kernel takes it, else on k and v repeated to H heads, and the plain core where no fused kernel
// takes the inputs (Note [Grouped-query attention through SDPA] in llama_layers.cpp); plain is
// the textbook core with k and v repeated.
// Init (Hugging Face's with initializer_range 0.02): normal(0, 0.02) for every Linear and
// Embedding weight, biases 0, RMSNorm weights 1.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include "leantrain/models/attention.h"
#include "leantrain/models/attention_memory.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/options.h"

namespace lt::models {

/// The options of the llama kind ([model] kind = "llama"); the registry binds each key to its
/// member (llama_options()), so a member's initializer is that option's default.
struct LlamaConfig {
  int64_t vocab_size = 257;
  int64_t hidden_size = 64;
  int64_t intermediate_size = 192;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 0;  // 0: num_attention_heads (plain multi-head attention)
  int64_t head_dim = 0;             // 0: hidden_size / num_attention_heads
  // Hugging Face's LlamaConfig defaults to 1e-6; Llama 3.x, Mistral and SmolLM2 ship 1e-5 in
  // their config.json (Qwen2.5 1e-6): leantrain's default is theirs.
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;  // Llama 3: 500000; Qwen2.5 and Qwen3: 1000000
  std::string rope_scaling = "none";  // none | llama3
  double rope_factor = 8.0;           // llama3 scaling (Llama 3.1 / 3.2's values)
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 8192;
  int64_t max_position_embeddings = 2048;
  int64_t seq_len = 128;  // training context (the data's block length), <= max_position_embeddings
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // Qwen2: biases on q_proj, k_proj, v_proj (never on o_proj)
  bool qk_norm = false;         // Qwen3: RMSNorm over head_dim on q and k before RoPE
  double dropout = 0.0;
  std::string attention = "sdpa";  // sdpa | plain (attention.h)
  std::string family = "llama";    // llama | qwen2 | qwen3 | mistral: what an export names
  std::string hidden_act = "silu";  // silu only

  int64_t kv_heads() const { return num_key_value_heads > 0 ? num_key_value_heads : num_attention_heads; }
  int64_t head_size() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
};

/// The llama kind's options table bound to LlamaConfig (defined with the other kinds' tables in
/// registry.cpp): llama_options().read(options) is the struct a resolved [model] section gives,
/// write(cfg) the section of a struct (ModelSection{"llama", llama_options().write(cfg)}).
const BoundOptions<LlamaConfig>& llama_options();
/// Cross-key checks after each option's own rule: throws lt::ConfigError naming model.<key>
/// (heads not divisible by key/value heads, hidden_size not divisible by heads when head_dim =
/// 0, an odd head_dim, seq_len above max_position_embeddings, llama3 factors that divide by 0).
void check_llama_config(const LlamaConfig& cfg);

/// The kernel at::scaled_dot_product_attention runs in the llama attention for q [B,H,T,h], k
/// and v [B,K,T,h], causal (sdpa_backend's names: "flash attention" | "memory-efficient" |
/// "cuDNN" | "math" | ...): with enable_gqa when K < H where a fused kernel takes it, else
/// (repeated = true) on k and v repeated to H heads. For "math" the plain core runs instead.
struct GqaKernel {
  std::string kernel;
  bool repeated = false;
};
GqaKernel gqa_sdpa_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p);

/// RoPE's inverse frequencies [h/2] in fp32 as Hugging Face computes them
/// (compute_default_rope_parameters; _compute_llama3_parameters when rope_scaling = "llama3").
torch::Tensor rope_inv_freq(const LlamaConfig& cfg);

/// The cos and sin tables [seq_len, h] of the RoPE positions 0..seq_len-1, computed on first use
/// per device and dtype (fp32 without autocast, then cast, as Hugging Face's rotary embedding)
/// and kept: outside the module state, shared by the blocks, safe to read from the thread a
/// recomputed block's rerun runs on.
class RopeTables {
 public:
  explicit RopeTables(const LlamaConfig& cfg) : inv_freq_(rope_inv_freq(cfg)), seq_len_(cfg.seq_len) {}
  /// cos, sin [t, h] for positions 0..t-1 (t <= seq_len) on `device` in `dtype`.
  std::pair<torch::Tensor, torch::Tensor> get(int64_t t, const c10::Device& device, c10::ScalarType dtype);

 private:
  torch::Tensor inv_freq_;
  int64_t seq_len_;
  std::mutex mu_;
  std::vector<std::pair<std::pair<std::string, c10::ScalarType>, std::pair<torch::Tensor, torch::Tensor>>> cache_;
};

/// Hugging Face's RMSNorm over the last dimension (above). out_dtype: the dtype its output is
/// cast to (the autocast dtype the projections after it would cast to, so that q, k and v share
/// one cast copy), or nullopt for weight * x's.
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x, std::optional<c10::ScalarType> out_dtype = std::nullopt);

  torch::Tensor weight;

 private:
  double eps_;
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const LlamaConfig& cfg);
  /// x [B,T,D] (the normed input), cos/sin [T,h] -> o_proj(attention) [B,T,D].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
  /// The attention core runs through this region when it materialises [B,H,T,T] tensors (the
  /// plain core); the model marks it cheap, so `selective` recomputes it (Note [Selective
  /// recompute under SDPA] in transformer.cpp: a fused kernel never runs through it).
  const CheapRegion& core_region() const { return core_region_; }
  /// "plain ..." or "sdpa: <kernel> (...)" for a batch of seq_len tokens in training when
  /// `training` (Model::compute_note).
  std::string backend(const c10::Device& device, c10::ScalarType dtype, int64_t seq_len, bool training) const;

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  std::shared_ptr<RMSNormImpl> q_norm, k_norm;  // null unless qk_norm

 private:
  CheapRegion core_region_;
  int64_t heads_, kv_heads_, head_dim_;
  double dropout_;
  AttentionImpl impl_;
};

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(int64_t hidden, int64_t intermediate);
  /// down_proj(silu(gate_proj(x)) * up_proj(x)); silu(gate) and the product recomputed in
  /// backward (Note [SwiGLU recomputed in the MLP's backward]), bitwise the same values.
  torch::Tensor forward(const torch::Tensor& x);
  /// The same graph and gradients, but down_proj's product is not computed: the output holds
  /// zeros (a recomputed block's rerun: Note [A unit's last product is not rerun]).
  torch::Tensor forward_for_gradients(const torch::Tensor& x);

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  torch::Tensor run(const torch::Tensor& x, bool output_read);
};

class LlamaBlockImpl : public BlockImpl {
 public:
  LlamaBlockImpl(const LlamaConfig& cfg, std::shared_ptr<RopeTables> rope);
  torch::Tensor forward(const torch::Tensor& x) override;
  /// The rerun's forward: the MLP's last product is not computed.
  torch::Tensor forward_for_gradients(const torch::Tensor& x) override;

  std::shared_ptr<RMSNormImpl> input_layernorm;
  std::shared_ptr<LlamaAttentionImpl> self_attn;
  std::shared_ptr<RMSNormImpl> post_attention_layernorm;
  std::shared_ptr<LlamaMLPImpl> mlp;

 private:
  torch::Tensor run(const torch::Tensor& x, bool output_read);
  std::shared_ptr<RopeTables> rope_;
  double dropout_;
};

class Llama : public Model {
 public:
  explicit Llama(const LlamaConfig& cfg);
  torch::Tensor forward(const torch::Tensor& input) override;
  /// The fused chunked head + loss in training (tied: the embedding's gradient added into the
  /// head's through a TiedGradSlot, as GPT); where it does not run in training (fp16 autocast)
  /// the head + loss in recomputed chunks: never the [B,T,V] logits in training. Outside
  /// training, or after set_fused_loss(false) without fp16, the plain loss on forward()'s logits.
  torch::Tensor forward_loss(const torch::Tensor& input, const torch::Tensor& target) override;
  Task task() const override { return Task::kCausalLM; }
  /// "attention sdpa: <kernel> (...)" at seq_len in training, GQA and the k/v repeat said.
  std::string compute_note(const c10::Device& device, c10::ScalarType dtype) const override;
  /// The final hidden states norm(blocks(embed_tokens[ids])), [B,T,D]; `slot` as GPT::hidden.
  torch::Tensor hidden(const torch::Tensor& input, const c10::intrusive_ptr<recompute::TiedGradSlot>& slot = {});
  /// The output head's weight: lm_head.weight, or embed_tokens.weight when tied.
  const torch::Tensor& head_weight() const;
  const LlamaConfig& config() const { return cfg_; }

  torch::nn::Embedding embed_tokens{nullptr};
  std::shared_ptr<RMSNormImpl> norm;
  torch::nn::Linear lm_head{nullptr};  // null when tie_word_embeddings

 private:
  LlamaConfig cfg_;
  std::shared_ptr<RopeTables> rope_;
};

/// The planner's attention term (attention_memory.h) for a llama config: what
/// transformer_attention_memory counts for H heads of head_dim, with the kernel asked with
/// enable_gqa as the model asks it (a kernel that takes no GQA makes the plain core run).
AttentionMemory llama_attention_memory(const LlamaConfig& cfg, const c10::Device& device, c10::ScalarType dtype,
                                       const recompute::RecomputePolicy& policy);

}  // namespace lt::models
