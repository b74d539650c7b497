// GPT and BERT, and the attention / MLP layers they share.
#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "leantrain/models/attention.h"
#include "leantrain/models/bert.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/gpt.h"
#include "leantrain/recompute/lm_loss.h"

namespace lt::models {

// The recompute layer's pieces (in_backward, dropout, packed inputs, the LM losses).
using namespace lt::recompute;

// ---- shared layers ----

SelfAttentionImpl::SelfAttentionImpl(int64_t d_model, int64_t n_head, double attn_dropout,
                                     bool causal)
    : d_model_(d_model), n_head_(n_head), attn_dropout_(attn_dropout), causal_(causal) {
  qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
  proj = register_module("proj", torch::nn::Linear(d_model, d_model));
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t b = x.size(0), t = x.size(1), hd = d_model_ / n_head_;
  auto parts = qkv(x).split(d_model_, /*dim=*/-1);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, n_head_, hd}).transpose(1, 2);  // [B,H,T,hd]
  };
  auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  auto y = core_region_.run([this](const std::vector<torch::Tensor>& in) { return core(in[0], in[1], in[2]); },
                            {q, k, v});
  y = y.transpose(1, 2).reshape({b, t, d_model_});
  return proj(y);
}

torch::Tensor SelfAttentionImpl::core(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t t = q.size(2), hd = q.size(3);
  // Plain attention (no fused SDPA) so the activation memory is the textbook one: the [B,H,T,T]
  // scores and probabilities are materialised.
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  if (causal_) {
    auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    att = att.masked_fill(mask, -std::numeric_limits<double>::infinity());
  }
  att = torch::softmax(att, -1);
  if (attn_dropout_ > 0.0) att = lt::recompute::dropout(att, attn_dropout_, is_training());
  return torch::matmul(att, v);
}

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ff, std::string approximate)
    : approximate_(std::move(approximate)) {
  fc = register_module("fc", torch::nn::Linear(d_model, d_ff));
  proj = register_module("proj", torch::nn::Linear(d_ff, d_model));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  return proj(torch::gelu(fc(x), approximate_));
}

void init_transformer_weights(torch::nn::Module& m, double std) {
  torch::NoGradGuard no_grad;
  for (auto& mod : m.modules(/*include_self=*/false)) {
    if (auto* lin = mod->as<torch::nn::Linear>()) {
      lin->weight.normal_(0.0, std);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = mod->as<torch::nn::Embedding>()) {
      emb->weight.normal_(0.0, std);
    } else if (auto* ln = mod->as<torch::nn::LayerNorm>()) {
      if (ln->weight.defined()) ln->weight.fill_(1.0);
      if (ln->bias.defined()) ln->bias.zero_();
    }
  }
}

namespace {

int64_t ff_width(const lt::models::ModelConfig& cfg) { return cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model; }

torch::nn::LayerNorm layer_norm(int64_t d, double eps) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({d}).eps(eps));
}

torch::Tensor check_ids(const torch::Tensor& input, int64_t seq_len, const char* who) {
  TORCH_CHECK(input.dim() == 2, who, ": expected token ids [B,T], got ", input.sizes());
  TORCH_CHECK(input.scalar_type() == torch::kLong, who, ": token ids must be int64, got ",
              input.scalar_type());
  TORCH_CHECK(input.size(1) <= seq_len, who, ": sequence length ", input.size(1),
              " exceeds model.seq_len = ", seq_len);
  return torch::arange(input.size(1), input.options());
}

}  // namespace

// ---- GPT ----

GPTBlockImpl::GPTBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout)
    : dropout_(dropout) {
  ln1 = register_module("ln1", layer_norm(d_model, 1e-5));
  attn = register_module("attn", std::make_shared<SelfAttentionImpl>(d_model, n_head, dropout,
                                                                     /*causal=*/true));
  ln2 = register_module("ln2", layer_norm(d_model, 1e-5));
  mlp = register_module("mlp", std::make_shared<FeedForwardImpl>(d_model, d_ff, "tanh"));
}

torch::Tensor GPTBlockImpl::forward(const torch::Tensor& x) {
  const bool train = is_training();
  auto h = x + lt::recompute::dropout(attn->forward(ln1(x)), dropout_, train);
  return h + lt::recompute::dropout(mlp->forward(ln2(h)), dropout_, train);
}

GPT::GPT(const lt::models::ModelConfig& cfg) : seq_len_(cfg.seq_len), dropout_(cfg.dropout) {
  wte = register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.seq_len, cfg.d_model));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto b = add_block("blocks", std::make_shared<GPTBlockImpl>(cfg.d_model, cfg.n_head, ff_width(cfg),
                                                                cfg.dropout));
    mark_cheap("blocks." + std::to_string(i) + ".attn.core", b->attn->core_region());
  }
  ln_f = register_module("ln_f", layer_norm(cfg.d_model, 1e-5));
  init_transformer_weights(*this);
}

torch::Tensor GPT::hidden(const torch::Tensor& input) {
  auto pos = check_ids(input, seq_len_, "GPT");
  auto x = lt::recompute::dropout(wte(input) + wpe(pos), dropout_, is_training());
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return ln_f(x);
}

torch::Tensor GPT::forward(const torch::Tensor& input) {
  return torch::linear(hidden(input), wte->weight);  // tied head: x @ wte^T
}

torch::Tensor GPT::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  if (const int64_t fused = fused_loss_chunk_tokens(wte->weight.size(0), input.device().type()))
    return fused_linear_cross_entropy(hidden(input), wte->weight, torch::Tensor(), target, fused);
  const int64_t chunk = loss_chunk_tokens(wte->weight.size(0));
  if (chunk == 0) return Model::forward_loss(input, target);
  auto w = wte->weight;
  return chunked_lm_loss(hidden(input), target, {w}, [w](const torch::Tensor& h) { return torch::linear(h, w); },
                         chunk);
}

// ---- BERT ----

BertBlockImpl::BertBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout)
    : dropout_(dropout) {
  attn = register_module("attn", std::make_shared<SelfAttentionImpl>(d_model, n_head, dropout,
                                                                     /*causal=*/false));
  ln1 = register_module("ln1", layer_norm(d_model, 1e-12));
  mlp = register_module("mlp", std::make_shared<FeedForwardImpl>(d_model, d_ff, "none"));
  ln2 = register_module("ln2", layer_norm(d_model, 1e-12));
}

torch::Tensor BertBlockImpl::forward(const torch::Tensor& x) {
  const bool train = is_training();
  auto h = ln1(x + lt::recompute::dropout(attn->forward(x), dropout_, train));
  return ln2(h + lt::recompute::dropout(mlp->forward(h), dropout_, train));
}

MLMHeadImpl::MLMHeadImpl(int64_t d_model, int64_t vocab_size) {
  dense = register_module("dense", torch::nn::Linear(d_model, d_model));
  ln = register_module("ln", layer_norm(d_model, 1e-12));
  bias = register_parameter("bias", torch::zeros({vocab_size}));
}

torch::Tensor MLMHeadImpl::transform(const torch::Tensor& x) { return ln(torch::gelu(dense(x))); }

torch::Tensor MLMHeadImpl::forward(const torch::Tensor& x, const torch::Tensor& decoder_weight) {
  return torch::linear(transform(x), decoder_weight, bias);
}

Bert::Bert(const lt::models::ModelConfig& cfg) : seq_len_(cfg.seq_len), dropout_(cfg.dropout) {
  tok_emb = register_module("tok_emb", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
  pos_emb = register_module("pos_emb", torch::nn::Embedding(cfg.seq_len, cfg.d_model));
  type_emb = register_module("type_emb", torch::nn::Embedding(cfg.type_vocab_size, cfg.d_model));
  emb_ln = register_module("emb_ln", layer_norm(cfg.d_model, 1e-12));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto b = add_block("blocks", std::make_shared<BertBlockImpl>(cfg.d_model, cfg.n_head, ff_width(cfg),
                                                                 cfg.dropout));
    mark_cheap("blocks." + std::to_string(i) + ".attn.core", b->attn->core_region());
  }
  mlm = register_module("mlm", std::make_shared<MLMHeadImpl>(cfg.d_model, cfg.vocab_size));
  init_transformer_weights(*this);
  torch::NoGradGuard no_grad;
  mlm->bias.zero_();
}

torch::Tensor Bert::hidden(const torch::Tensor& input) {
  auto pos = check_ids(input, seq_len_, "BERT");
  auto x = tok_emb(input) + pos_emb(pos) + type_emb->weight[0];
  x = lt::recompute::dropout(emb_ln(x), dropout_, is_training());
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return x;
}

torch::Tensor Bert::forward(const torch::Tensor& input) { return mlm->forward(hidden(input), tok_emb->weight); }

torch::Tensor Bert::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  if (const int64_t fused = fused_loss_chunk_tokens(tok_emb->weight.size(0), input.device().type())) {
    // Only the masked tokens reach the head (Note [Fused LM loss]): its transform too.
    auto h = hidden(input);
    const auto t = target.reshape({-1});
    const auto rows = (t != kIgnoreIndex).nonzero().squeeze(1);
    const auto hv = h.reshape({-1, h.size(-1)}).index_select(0, rows);
    return fused_linear_cross_entropy(mlm->transform(hv), tok_emb->weight, mlm->bias, t.index_select(0, rows), fused);
  }
  const int64_t chunk = loss_chunk_tokens(tok_emb->weight.size(0));
  if (chunk == 0) return Model::forward_loss(input, target);
  auto params = mlm->parameters();
  params.push_back(tok_emb->weight);
  auto head = mlm;
  auto w = tok_emb->weight;
  return chunked_lm_loss(hidden(input), target, params,
                         [head, w](const torch::Tensor& h) { return head->forward(h, w); }, chunk);
}

}  // namespace lt::models
