// The Llama-family decoder (llama.h): its checks, blocks, the model with its fused head + loss,
// and the planner's attention term. The layers are in llama_layers.cpp.
#include "leantrain/models/llama.h"

#include <ATen/autocast_mode.h>

#include <torch/torch.h>

#include "leantrain/recompute/lm_loss.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {

using namespace lt::recompute;

namespace {

std::string num(double v) { return option_literal(OptionValue(v)); }

}  // namespace

void check_llama_config(const LlamaConfig& c) {
  const int64_t h = c.num_attention_heads, k = c.kv_heads();
  if (h % k != 0)
    throw ConfigError("model.num_key_value_heads = " + std::to_string(c.num_key_value_heads) +
                      ": must divide model.num_attention_heads = " + std::to_string(h) +
                      " (each key/value head serves num_attention_heads / num_key_value_heads query heads)");
  if (c.head_dim == 0 && c.hidden_size % h != 0)
    throw ConfigError("model.num_attention_heads = " + std::to_string(h) + ": must divide model.hidden_size = " +
                      std::to_string(c.hidden_size) + " when model.head_dim = 0 (each head gets hidden_size / heads " +
                      "features; or give model.head_dim)");
  if (c.head_size() % 2 != 0)
    throw ConfigError("model.head_dim = " + std::to_string(c.head_dim) + ": the head size " +
                      std::to_string(c.head_size()) + " must be even (RoPE rotates its two halves)");
  if (c.seq_len > c.max_position_embeddings)
    throw ConfigError("model.seq_len = " + std::to_string(c.seq_len) + ": must be <= model.max_position_embeddings = " +
                      std::to_string(c.max_position_embeddings) + " (the positions the model was built for)");
  if (c.rope_scaling == "llama3" && c.rope_high_freq_factor <= c.rope_low_freq_factor)
    throw ConfigError("model.rope_high_freq_factor = " + num(c.rope_high_freq_factor) +
                      ": must be > model.rope_low_freq_factor = " + num(c.rope_low_freq_factor) +
                      " (llama3 RoPE scaling divides by their difference)");
}

// ---- the block ----

namespace {

// The dtype a Linear would cast x to under autocast on x's device, or nullopt (autocast off, or
// x not a float it casts).
std::optional<c10::ScalarType> autocast_dtype_of(const torch::Tensor& x) {
  const auto device = x.device().type();
  if (!at::autocast::is_autocast_enabled(device) || !at::isFloatingType(x.scalar_type()) ||
      x.scalar_type() == at::kDouble)
    return std::nullopt;
  return at::autocast::get_autocast_dtype(device);
}

}  // namespace

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& cfg, std::shared_ptr<RopeTables> rope)
    : rope_(std::move(rope)), dropout_(cfg.dropout) {
  input_layernorm =
      register_module("input_layernorm", std::make_shared<RMSNormImpl>(cfg.hidden_size, cfg.rms_norm_eps));
  self_attn = register_module("self_attn", std::make_shared<LlamaAttentionImpl>(cfg));
  post_attention_layernorm =
      register_module("post_attention_layernorm", std::make_shared<RMSNormImpl>(cfg.hidden_size, cfg.rms_norm_eps));
  mlp = register_module("mlp", std::make_shared<LlamaMLPImpl>(cfg.hidden_size, cfg.intermediate_size));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x) { return run(x, /*output_read=*/true); }

torch::Tensor LlamaBlockImpl::forward_for_gradients(const torch::Tensor& x) { return run(x, /*output_read=*/false); }

torch::Tensor LlamaBlockImpl::run(const torch::Tensor& x, bool output_read) {
  const bool train = is_training();
  // cos/sin in the hidden states' dtype, as LlamaRotaryEmbedding returns them.
  const auto [cos, sin] = rope_->get(x.size(1), x.device(), x.scalar_type());
  const auto cast = autocast_dtype_of(x);  // Note [RMSNorm keeps its input and rsqrt]: one cast copy
  auto h = x + lt::recompute::dropout(self_attn->forward(input_layernorm->forward(x, cast), cos, sin), dropout_, train);
  const auto y = post_attention_layernorm->forward(h, cast);
  return h + lt::recompute::dropout(output_read ? mlp->forward(y) : mlp->forward_for_gradients(y), dropout_, train);
}

// ---- the model ----

Llama::Llama(const LlamaConfig& cfg) : cfg_(cfg) {
  check_llama_config(cfg);
  rope_ = std::make_shared<RopeTables>(cfg);
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(cfg.vocab_size, cfg.hidden_size));
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    auto b = add_block("blocks", std::make_shared<LlamaBlockImpl>(cfg, rope_));
    mark_cheap("blocks." + std::to_string(i) + ".self_attn.core", b->self_attn->core_region());
  }
  norm = register_module("norm", std::make_shared<RMSNormImpl>(cfg.hidden_size, cfg.rms_norm_eps));
  if (!cfg.tie_word_embeddings)
    lm_head = register_module(
        "lm_head", torch::nn::Linear(torch::nn::LinearOptions(cfg.hidden_size, cfg.vocab_size).bias(false)));
  init_transformer_weights(*this);  // RMSNorm weights stay 1
}

const torch::Tensor& Llama::head_weight() const { return lm_head ? lm_head->weight : embed_tokens->weight; }

torch::Tensor Llama::hidden(const torch::Tensor& input, const c10::intrusive_ptr<TiedGradSlot>& slot) {
  TORCH_CHECK(input.dim() == 2, "Llama: expected token ids [B,T], got ", input.sizes());
  TORCH_CHECK(input.scalar_type() == torch::kLong, "Llama: token ids must be int64, got ", input.scalar_type());
  TORCH_CHECK(input.size(1) <= cfg_.seq_len, "Llama: sequence length ", input.size(1),
              " exceeds model.seq_len = ", cfg_.seq_len);
  auto x = cfg_.tie_word_embeddings ? tied_embedding(embed_tokens->weight, input, slot) : embed_tokens(input);
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return norm->forward(x);
}

torch::Tensor Llama::forward(const torch::Tensor& input) { return torch::linear(hidden(input), head_weight()); }

torch::Tensor Llama::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  const auto& w = head_weight();
  if (const int64_t fused = fused_loss_chunk_tokens(w.size(0), w.size(1), input.device().type())) {
    // Tied: the embedding's backward adds into the head's weight gradient (lm_loss.h).
    auto slot = cfg_.tie_word_embeddings ? c10::make_intrusive<TiedGradSlot>() : c10::intrusive_ptr<TiedGradSlot>();
    return fused_linear_cross_entropy(hidden(input, slot), w, torch::Tensor(), target, fused, head_matmul(), slot);
  }
  int64_t chunk = loss_chunk_tokens(w.size(0));
  // Where the fused loss does not run in training (fp16, lm_loss.h) the head still never makes
  // the [B,T,V] logits (a 128k-152k vocabulary): recomputed chunks (Note [Chunked LM loss]).
  if (chunk == 0 && is_training() && torch::GradMode::is_enabled() && !fused_lm_loss_applies(input.device().type()))
    chunk = lm_loss_chunk_tokens(w.size(0));
  if (chunk == 0) return Model::forward_loss(input, target);
  return chunked_lm_loss(hidden(input), target, {w}, [w](const torch::Tensor& h) { return torch::linear(h, w); },
                         chunk);
}

std::string Llama::compute_note(const c10::Device& device, c10::ScalarType dtype) const {
  const auto& block = std::static_pointer_cast<LlamaBlockImpl>(blocks().front());
  std::string note = "attention " + block->self_attn->backend(device, dtype, cfg_.seq_len, true);
  if (head_products_in_fp32(head_matmul(), dtype, device.type()))
    note += std::string("; LM head products as fp32 GEMMs of bf16-rounded operands") +
            (head_matmul() == HeadMatmul::kAuto ? " (precision.head_matmul = auto: x86 CPU without AMX-BF16)" : "");
  return note;
}

// ---- the planner's attention term ----

AttentionMemory llama_attention_memory(const LlamaConfig& cfg, const c10::Device& device, c10::ScalarType dtype,
                                       const RecomputePolicy& policy) {
  // transformer_attention_memory counts [H,T,T] scores per layer, whatever the head size: a
  // GPT of H heads of head_dim features is the same term.
  ModelConfig c;
  c.kind = "llama";
  c.n_layer = cfg.num_hidden_layers;
  c.n_head = cfg.num_attention_heads;
  c.d_model = cfg.num_attention_heads * cfg.head_size();
  c.seq_len = cfg.seq_len;
  c.dropout = cfg.dropout;
  c.attention = cfg.attention;
  if (parse_attention(cfg.attention) == AttentionImpl::kPlain)
    return transformer_attention_memory(c, /*causal=*/true, device, dtype, policy);
  // The kernel as the model asks it, with enable_gqa (Note [Grouped-query attention through SDPA]).
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  auto q = torch::empty({1, cfg.num_attention_heads, cfg.seq_len, cfg.head_size()}, opts).requires_grad_(true);
  auto k = torch::empty({1, cfg.kv_heads(), cfg.seq_len, cfg.head_size()}, opts).requires_grad_(true);
  const GqaKernel choice = gqa_sdpa_backend(q, k, k, cfg.dropout);
  if (choice.kernel != "math") {
    AttentionMemory m;
    m.has_attention = m.fused = m.selective_is_none = true;
    m.core = "sdpa: " + choice.kernel + (choice.repeated ? " on k/v repeated" : "");
    m.layers = c.n_layer;
    m.heads = c.n_head;
    m.seq_len = c.seq_len;
    return m;
  }
  c.attention = "plain";
  AttentionMemory m = transformer_attention_memory(c, /*causal=*/true, device, dtype, policy);
  m.core = "sdpa: math, so the plain core";
  return m;
}

}  // namespace lt::models
