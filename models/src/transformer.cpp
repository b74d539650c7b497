// GPT and BERT, and the attention / MLP layers they share.
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <stdexcept>

#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <torch/torch.h>

#include "leantrain/models/attention.h"
#include "leantrain/models/bert.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/gpt.h"
#include "leantrain/recompute/lm_loss.h"
#include "leantrain/recompute/cpu_kernels.h"

namespace lt::models {

// The recompute layer's pieces (in_backward, dropout, packed inputs, the LM losses).
using namespace lt::recompute;

// ---- shared layers ----

// Note [Attention through SDPA]
// model.attention = "sdpa" (the default) runs the core through at::scaled_dot_product_attention,
// what nanoGPT, Hugging Face and torchtitan call: LibTorch picks a fused kernel (flash attention
// on the CPU and on GPUs; memory-efficient or cuDNN on GPUs where flash cannot run) that never
// materialises the [B,H,T,T] scores and probabilities, and keeps q, k, v, the output and a
// [B,H,T] logsumexp for backward. Masks: causal alone is SDPA's is_causal; a key-padding mask
// becomes a boolean attn_mask [B,1,1,T] (SDPA turns it into an additive -inf mask), combined
// with the causal triangle into [B,1,T,T] when both apply (SDPA takes either is_causal or a
// mask). Attention dropout is SDPA's dropout_p in training (the fused kernels on CUDA draw it
// from the CUDA generator's philox state, which recompute restores, so a rerun draws the same
// mask). "plain" is the textbook core, kept bitwise equal to the Python reference's plain path
// for the reference tests. SelfAttentionImpl::backend names the kernel at startup
// (Model::compute_note).
//
// Note [SDPA's math fallback]
// Where no fused kernel takes the inputs — on the CPU, any attention dropout: LibTorch's CPU
// flash kernel has none — SDPA would run its math fallback, which on the CPU computes bf16 and
// fp16 inputs in fp32 and keeps three fp32 [B,H,T,T] tensors (the softmax, the dropout noise,
// the dropped probabilities): twice the bytes of the plain core's three bf16 ones, for the
// same function. So "sdpa" runs the plain core there (attention_core asks
// at::_fused_sdp_choice first): in bf16 it keeps half of what the fallback would, and its
// dropout is lt::recompute::dropout, whose masks a recompute keeps as bits (Note [Dropout masks
// kept as bits]). Either way the [B,H,T,T] probabilities exist; attention dropout = 0 (as
// GPT pretraining recipes set it) is what lets the fused kernel run on the CPU.

AttentionImpl parse_attention(const std::string& name) {
  if (name == "sdpa") return AttentionImpl::kSdpa;
  if (name == "plain") return AttentionImpl::kPlain;
  throw std::invalid_argument("attention \"" + name + "\": expected \"sdpa\" or \"plain\"");
}

const char* attention_name(AttentionImpl impl) { return impl == AttentionImpl::kSdpa ? "sdpa" : "plain"; }

namespace {

// SDPA's attn_mask for a key-padding mask [B,T] (true = attend), with the causal triangle folded
// in when `causal`; undefined when there is no padding mask (is_causal covers causal alone).
std::optional<torch::Tensor> sdpa_mask(const torch::Tensor& key_padding_mask, int64_t t, bool causal) {
  if (!key_padding_mask.defined()) return std::nullopt;
  TORCH_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(1) == t && key_padding_mask.scalar_type() == torch::kBool,
              "attention: key_padding_mask must be bool [B,T] with T = ", t, ", got ", key_padding_mask.sizes(), " ",
              key_padding_mask.scalar_type());
  auto m = key_padding_mask.view({key_padding_mask.size(0), 1, 1, t});
  if (causal) m = m & torch::ones({t, t}, m.options()).tril();
  return m;
}

// The kernel SDPA runs for these arguments: at::_fused_sdp_choice, what SDPA itself asks.
at::SDPBackend sdpa_choice(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                           const std::optional<torch::Tensor>& mask, bool causal, double p) {
  return static_cast<at::SDPBackend>(at::_fused_sdp_choice(q, k, v, mask, p, /*is_causal=*/causal && !mask.has_value()));
}

}  // namespace

bool sdpa_runs_fused(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                     const torch::Tensor& key_padding_mask, bool causal, double dropout_p) {
  return sdpa_choice(q, k, v, sdpa_mask(key_padding_mask, q.size(2), causal), causal, dropout_p) !=
         at::SDPBackend::math;
}

torch::Tensor attention_core(AttentionImpl impl, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& key_padding_mask, bool causal, double dropout_p, bool train) {
  const int64_t t = q.size(2), hd = q.size(3);
  if (impl == AttentionImpl::kSdpa) {
    const double p = train ? dropout_p : 0.0;
    auto mask = sdpa_mask(key_padding_mask, t, causal);
    // Note [SDPA's math fallback]
    if (sdpa_choice(q, k, v, mask, causal, p) != at::SDPBackend::math)
      return at::scaled_dot_product_attention(q, k, v, mask, p, /*is_causal=*/causal && !mask.has_value());
  }
  // Plain attention: the [B,H,T,T] scores and probabilities are materialised.
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  if (causal) {
    auto mask = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).triu(1);
    att = att.masked_fill(mask, -std::numeric_limits<double>::infinity());
  }
  if (key_padding_mask.defined()) {
    (void)sdpa_mask(key_padding_mask, t, false);  // the same checks
    att = att.masked_fill(key_padding_mask.logical_not().view({key_padding_mask.size(0), 1, 1, t}),
                          -std::numeric_limits<double>::infinity());
  }
  att = torch::softmax(att, -1);
  if (dropout_p > 0.0) att = lt::recompute::dropout(att, dropout_p, train);
  return torch::matmul(att, v);
}

std::string sdpa_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& key_padding_mask, bool causal, double dropout_p) {
  switch (sdpa_choice(q, k, v, sdpa_mask(key_padding_mask, q.size(2), causal), causal, dropout_p)) {
    case at::SDPBackend::flash_attention: return "flash attention";
    case at::SDPBackend::efficient_attention: return "memory-efficient";
    case at::SDPBackend::cudnn_attention: return "cuDNN";
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none (no kernel takes these inputs)";
  }
}

SelfAttentionImpl::SelfAttentionImpl(int64_t d_model, int64_t n_head, double attn_dropout, bool causal,
                                     AttentionImpl impl)
    : d_model_(d_model), n_head_(n_head), attn_dropout_(attn_dropout), causal_(causal), impl_(impl) {
  qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
  proj = register_module("proj", torch::nn::Linear(d_model, d_model));
}

// Note [Selective recompute under SDPA]
// `selective` recomputes the attention core because it keeps [B,H,T,T] tensors (scores,
// probabilities, the dropout mask) for a few FLOPs. A fused SDPA kernel keeps none: for
// backward it saves q, k, v (views of the qkv projection's output), its output (which proj
// saves anyway: the core's [B,H,T,hd] output is laid out [B,T,H,hd], so merging the heads is a
// view) and the [B,H,T] fp32 logsumexp. Recomputing it would still keep q, k, v as the
// recompute's inputs and drop only the logsumexp (B*H*T*4 bytes: 192 KiB a layer for GPT-2
// small at B=4, T=1024) for a second attention forward in backward. So the core goes through
// the region only when it materialises the probabilities: the plain core, which "sdpa" also
// runs where no fused kernel takes the inputs (Note [SDPA's math fallback]). Under a fused kernel
// `selective` keeps everything, as `none` (its measured peak equals none's:
// docs/PRECISION_AND_MEMORY.md); `full` is the policy that saves memory there.
torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& key_padding_mask) {
  const int64_t b = x.size(0), t = x.size(1), hd = d_model_ / n_head_;
  auto parts = qkv(x).split(d_model_, /*dim=*/-1);
  auto heads = [&](const torch::Tensor& y) {
    return y.view({b, t, n_head_, hd}).transpose(1, 2);  // [B,H,T,hd]
  };
  auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  const double p = attn_dropout_;
  const bool train = is_training(), causal = causal_;
  const AttentionImpl impl = impl_;
  auto core = [impl, p, train, causal](const std::vector<torch::Tensor>& in) {
    return attention_core(impl, in[0], in[1], in[2], in.size() > 3 ? in[3] : torch::Tensor(), causal, p, train);
  };
  std::vector<torch::Tensor> in{q, k, v};
  if (key_padding_mask.defined()) in.push_back(key_padding_mask);
  // Note [Selective recompute under SDPA]
  const bool through_region =
      core_region_.recompute() && torch::GradMode::is_enabled() &&
      (impl_ == AttentionImpl::kPlain || !sdpa_runs_fused(q, k, v, key_padding_mask, causal_, train ? p : 0.0));
  auto y = through_region ? core_region_.run(core, in) : core(in);
  y = y.transpose(1, 2).reshape({b, t, d_model_});
  return proj(y);
}

std::string SelfAttentionImpl::backend(const c10::Device& device, c10::ScalarType dtype, int64_t seq_len,
                                       bool training) const {
  if (impl_ == AttentionImpl::kPlain) return "plain (softmax(QK^T)V, [B,H,T,T] probabilities kept)";
  auto q = torch::empty({1, n_head_, seq_len, d_model_ / n_head_}, torch::TensorOptions().dtype(dtype).device(device))
               .requires_grad_(training);
  const double p = training ? attn_dropout_ : 0.0;
  const std::string kernel = sdpa_backend(q, q, q, torch::Tensor(), causal_, p);
  std::string note = "sdpa: " + kernel + " (LibTorch's choice on " + device.str() + ", " + c10::toString(dtype) +
                     (causal_ ? ", causal" : ", bidirectional") + ", dropout " + std::to_string(p).substr(0, 4) + ")";
  if (kernel == "math")
    note += std::string("; no fused kernel takes these inputs") +
            (device.is_cpu() && p > 0.0 ? " (the CPU's flash kernel takes no dropout: model.dropout = 0 enables it)"
                                        : "") +
            ", so the plain core runs instead of LibTorch's math fallback, keeping the [B,H,T,T] probabilities";
  return note;
}

FeedForwardImpl::FeedForwardImpl(int64_t d_model, int64_t d_ff, std::string approximate)
    : approximate_(std::move(approximate)) {
  fc = register_module("fc", torch::nn::Linear(d_model, d_ff));
  proj = register_module("proj", torch::nn::Linear(d_ff, d_model));
}

// Note [GELU recomputed in the MLP's backward]
// proj(gelu(h)), h = fc(x), as autograd records it keeps two [B,T,F] tensors (F = 4D) from
// forward to backward: h, which GELU's backward reads, and g = gelu(h), which proj's backward
// reads for its weight gradient (under autocast, proj's low-precision copy of its weight too).
// In a GPT layer under bf16 with SDPA that is 8 of the 18 [B,T,D] tensors' worth a layer keeps
// (docs/PRECISION_AND_MEMORY.md). GeluLinear keeps h and proj's parameters themselves, and
// backward computes g = gelu(h) again: one elementwise pass over [B,T,F] and one cast of the
// weight, next to the block's matmuls, for 4 of the 18 tensors — what torch.compile's min-cut
// partitioner does with cheap pointwise ops at no recompute. The output and gradients are
// bitwise those of proj(gelu(h)): forward runs what proj's forward runs
// (torch::nn::functional::linear: addmm for [N,F] rows; above two dimensions a matmul, which
// folds h into [N,F] rows, then += bias; autocast casts as before), backward the ops autograd
// runs for that graph — the matmul's mm_mat1_backward and mm_mat2_backward (the transposed
// weight is column-major), the bias gradient summed to its shape in the output's dtype,
// the GELU's backward (lt::recompute::gelu_backward, which the plain graph's GELU runs too: the
// tanh GELU's CPU kernel, Note [CPU kernels for the tanh GELU and the loss's softmax], else
// at::gelu_backward), and the casts back to the inputs' dtypes that autocast's ToCopyBackward0
// nodes do (tests/unit/test_feed_forward.cpp, which also runs whole GPT and BERT steps against
// the plain graph, FeedForwardImpl::recompute_gelu = false). Outside grad mode (a recompute's
// first forward, eval), with nothing requiring a gradient, or where the matmul would not fold
// (h not contiguous), the plain expression runs. So it does in a recomputed block's rerun
// (recompute::rerunning(): full and every:K): that rerun's graph lives only until its own
// backward, right after, so keeping g there costs one block's [B,T,F] for a moment, and
// recomputing it would be a third GELU over [B,T,F] per layer (1.4 % of a GPT-6L fp32 step).
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// proj's backward for linear(g, weight, bias), the ops autograd runs for it (above), for the
// gradients ctx needs (input 0: what g is made from, 1: weight, 2: bias): g's gradient in
// g_dtype and g_sizes, the weight's and the bias's. g_operand() gives g in linear_dtype, the
// product's operand; it is called only for the weight gradient.
struct ProjGrads {
  torch::Tensor g, weight, bias;
};
ProjGrads proj_backward(AutogradContext* ctx, const torch::Tensor& grad_out, const torch::Tensor& weight,
                        const torch::Tensor& bias, c10::ScalarType linear_dtype, at::IntArrayRef g_sizes,
                        c10::ScalarType g_dtype, const std::function<torch::Tensor()>& g_operand) {
  const auto grad = grad_out.reshape({-1, weight.size(0)});  // [N,D], the matmul's output
  ProjGrads r;
  if (ctx->needs_input_grad(1))
    r.weight = grad.t().mm(g_operand().reshape({-1, weight.size(1)})).to(weight.scalar_type());
  if (ctx->needs_input_grad(2)) r.bias = at::sum_to(grad_out, bias.sizes()).to(bias.scalar_type());
  if (ctx->needs_input_grad(0)) r.g = grad.mm(weight.to(linear_dtype)).view(g_sizes).to(g_dtype);
  return r;
}

struct GeluLinear : torch::autograd::Function<GeluLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& weight,
                               const torch::Tensor& bias, const std::string& approximate) {
    const auto g = lt::recompute::gelu(h, approximate);
    auto out = torch::nn::functional::linear(g, weight, bias);  // what proj(g) runs, autocast included
    ctx->save_for_backward({h, weight, bias});
    ctx->saved_data["approximate"] = approximate;
    ctx->saved_data["gelu_dtype"] = static_cast<int64_t>(g.scalar_type());
    ctx->saved_data["linear_dtype"] = static_cast<int64_t>(out.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    // The dtypes are forward's, cast explicitly: autocast has no say here.
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto& h = saved[0];
    const auto& weight = saved[1];
    const auto& bias = saved[2];
    const auto approximate = ctx->saved_data["approximate"].toStringRef();
    const auto gelu_dtype = static_cast<c10::ScalarType>(ctx->saved_data["gelu_dtype"].toInt());
    const auto linear_dtype = static_cast<c10::ScalarType>(ctx->saved_data["linear_dtype"].toInt());
    // proj's weight gradient grad^T g, from g computed again (then let go).
    auto r = proj_backward(ctx, grad_out[0], weight, bias, linear_dtype, h.sizes(), gelu_dtype, [&] {
      return lt::recompute::gelu(h.to(gelu_dtype), approximate).to(linear_dtype);
    });
    torch::Tensor grad_h;
    if (r.g.defined())
      grad_h = lt::recompute::gelu_backward(r.g, h.to(gelu_dtype), approximate).to(h.scalar_type());
    return {grad_h, r.weight, r.bias, torch::Tensor()};
  }
};

// Note [A unit's last product is not rerun]
// A recomputed GPT block (memory.recompute = full, every:K) is run twice: forward without a
// graph, then in backward again with one, which backward differentiates at once
// (recompute::in_backward). That rerun's output is never read: backward needs the tensors the
// graph saved, not the values at its end, and its last op, h + proj(gelu(fc(ln2(h)))), saves
// nothing of its output (an add; proj's backward reads its input, its weight and the incoming
// gradient). So the rerun (GPTBlockImpl::forward_for_gradients, passed to in_backward as its
// `rerun`) ends in UnreadLinear: a node that saves what proj's backward reads and whose
// backward runs GeluLinear's matmuls (proj_backward: the same ops as autograd's for proj), and
// whose output is zeros of proj's output dtype and shape instead of the [N,F] x [F,D] product:
// at d 768 and 1,024 tokens 4.8 of the rerun's 14.5 GFLOP of matmuls, ~17 ms on 2 cores; with
// the first forward and the backward, 1/12 of a recomputed layer's. ResNet's units drop their
// last BatchNorm the same way (Note [A unit's last BatchNorm is not rerun]). BERT's post-LN
// block ends with a LayerNorm, whose backward reads its input, so it has no such product.
// The gradients are bitwise the plain rerun's (the Recompute tests compare recomputed and plain
// GPT steps bitwise).
struct UnreadLinear : torch::autograd::Function<UnreadLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g, const torch::Tensor& weight,
                               const torch::Tensor& bias) {
    // The dtype proj's linear would compute in: autocast's where it is on, else the inputs'.
    const auto device = g.device().type();
    const auto dtype = at::autocast::is_autocast_enabled(device) && at::isFloatingType(g.scalar_type()) &&
                               g.scalar_type() != at::kDouble
                           ? at::autocast::get_autocast_dtype(device)
                           : at::result_type(g, weight);
    auto sizes = g.sizes().vec();
    sizes.back() = weight.size(0);
    ctx->save_for_backward({g.to(dtype), weight, bias});
    ctx->saved_data["g_dtype"] = static_cast<int64_t>(g.scalar_type());
    return torch::zeros(sizes, g.options().dtype(dtype));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto& g = saved[0];  // in the product's dtype
    const auto& weight = saved[1];
    const auto& bias = saved[2];
    const auto g_dtype = static_cast<c10::ScalarType>(ctx->saved_data["g_dtype"].toInt());
    auto r = proj_backward(ctx, grad_out[0], weight, bias, g.scalar_type(), g.sizes(), g_dtype, [&] { return g; });
    return {r.g, r.weight, r.bias};
  }
};

}  // namespace

torch::Tensor FeedForwardImpl::forward_for_gradients(const torch::Tensor& x) {
  const auto h = fc(x);
  const bool grad = torch::GradMode::is_enabled() &&
                    (h.requires_grad() || proj->weight.requires_grad() || proj->bias.requires_grad());
  if (!grad || h.dim() < 2 || !h.is_contiguous() || !proj->bias.defined())
    return proj(lt::recompute::gelu_autograd(h, approximate_));
  return UnreadLinear::apply(lt::recompute::gelu_autograd(h, approximate_), proj->weight, proj->bias);
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  const auto h = fc(x);
  const bool grad = torch::GradMode::is_enabled() &&
                    (h.requires_grad() || proj->weight.requires_grad() || proj->bias.requires_grad());
  if (!recompute_gelu || !grad || h.dim() < 2 || !h.is_contiguous() || !proj->bias.defined() ||
      lt::recompute::rerunning())
    return proj(lt::recompute::gelu_autograd(h, approximate_));
  return GeluLinear::apply(h, proj->weight, proj->bias, approximate_);
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

GPTBlockImpl::GPTBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout, AttentionImpl attention)
    : dropout_(dropout) {
  ln1 = register_module("ln1", layer_norm(d_model, 1e-5));
  attn = register_module("attn", std::make_shared<SelfAttentionImpl>(d_model, n_head, dropout,
                                                                     /*causal=*/true, attention));
  ln2 = register_module("ln2", layer_norm(d_model, 1e-5));
  mlp = register_module("mlp", std::make_shared<FeedForwardImpl>(d_model, d_ff, "tanh"));
}

torch::Tensor GPTBlockImpl::forward(const torch::Tensor& x) { return run(x, /*output_read=*/true); }

torch::Tensor GPTBlockImpl::forward_for_gradients(const torch::Tensor& x) { return run(x, /*output_read=*/false); }

torch::Tensor GPTBlockImpl::run(const torch::Tensor& x, bool output_read) {
  const bool train = is_training();
  auto h = x + lt::recompute::dropout(attn->forward(ln1(x)), dropout_, train);
  const auto y = ln2(h);
  return h + lt::recompute::dropout(output_read ? mlp->forward(y) : mlp->forward_for_gradients(y), dropout_, train);
}

GPT::GPT(const lt::models::ModelConfig& cfg) : seq_len_(cfg.seq_len), dropout_(cfg.dropout) {
  wte = register_module("wte", torch::nn::Embedding(cfg.vocab_size, cfg.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(cfg.seq_len, cfg.d_model));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    auto b = add_block("blocks", std::make_shared<GPTBlockImpl>(cfg.d_model, cfg.n_head, ff_width(cfg),
                                                                cfg.dropout, parse_attention(cfg.attention)));
    mark_cheap("blocks." + std::to_string(i) + ".attn.core", b->attn->core_region());
  }
  ln_f = register_module("ln_f", layer_norm(cfg.d_model, 1e-5));
  init_transformer_weights(*this);
}

namespace {

// The head's part of compute_note: said only where its products leave the autocast dtype.
std::string head_note(lt::recompute::HeadMatmul m, const c10::Device& device, c10::ScalarType dtype) {
  if (!lt::recompute::head_products_in_fp32(m, dtype, device.type())) return "";
  return std::string("; LM head products as fp32 GEMMs of bf16-rounded operands") +
         (m == lt::recompute::HeadMatmul::kAuto ? " (precision.head_matmul = auto: x86 CPU without AMX-BF16)" : "");
}

}  // namespace

std::string GPT::compute_note(const c10::Device& device, c10::ScalarType dtype) const {
  return "attention " + std::static_pointer_cast<GPTBlockImpl>(blocks().front())->attn->backend(device, dtype, seq_len_, true) +
         head_note(head_matmul(), device, dtype);
}

torch::Tensor GPT::hidden(const torch::Tensor& input) { return hidden(input, {}); }

torch::Tensor GPT::hidden(const torch::Tensor& input, const c10::intrusive_ptr<TiedGradSlot>& slot) {
  auto pos = check_ids(input, seq_len_, "GPT");
  auto x = lt::recompute::dropout(tied_embedding(wte->weight, input, slot) + wpe(pos), dropout_, is_training());
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return ln_f(x);
}

torch::Tensor GPT::forward(const torch::Tensor& input) {
  return torch::linear(hidden(input), wte->weight);  // tied head: x @ wte^T
}

torch::Tensor GPT::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  if (const int64_t fused = fused_loss_chunk_tokens(wte->weight.size(0), wte->weight.size(1), input.device().type())) {
    auto slot = c10::make_intrusive<TiedGradSlot>();
    return fused_linear_cross_entropy(hidden(input, slot), wte->weight, torch::Tensor(), target, fused, head_matmul(),
                                      slot);
  }
  const int64_t chunk = loss_chunk_tokens(wte->weight.size(0));
  if (chunk == 0) return Model::forward_loss(input, target);
  auto w = wte->weight;
  return chunked_lm_loss(hidden(input), target, {w}, [w](const torch::Tensor& h) { return torch::linear(h, w); },
                         chunk);
}

// ---- BERT ----

BertBlockImpl::BertBlockImpl(int64_t d_model, int64_t n_head, int64_t d_ff, double dropout, AttentionImpl attention)
    : dropout_(dropout) {
  attn = register_module("attn", std::make_shared<SelfAttentionImpl>(d_model, n_head, dropout,
                                                                     /*causal=*/false, attention));
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
                                                                 cfg.dropout, parse_attention(cfg.attention)));
    mark_cheap("blocks." + std::to_string(i) + ".attn.core", b->attn->core_region());
  }
  mlm = register_module("mlm", std::make_shared<MLMHeadImpl>(cfg.d_model, cfg.vocab_size));
  init_transformer_weights(*this);
  torch::NoGradGuard no_grad;
  mlm->bias.zero_();
}

std::string Bert::compute_note(const c10::Device& device, c10::ScalarType dtype) const {
  return "attention " + std::static_pointer_cast<BertBlockImpl>(blocks().front())->attn->backend(device, dtype, seq_len_, true) +
         head_note(head_matmul(), device, dtype);
}

torch::Tensor Bert::hidden(const torch::Tensor& input) { return hidden(input, {}); }

torch::Tensor Bert::hidden(const torch::Tensor& input, const c10::intrusive_ptr<TiedGradSlot>& slot) {
  auto pos = check_ids(input, seq_len_, "BERT");
  auto x = tied_embedding(tok_emb->weight, input, slot) + pos_emb(pos) + type_emb->weight[0];
  x = lt::recompute::dropout(emb_ln(x), dropout_, is_training());
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return x;
}

torch::Tensor Bert::forward(const torch::Tensor& input) { return mlm->forward(hidden(input), tok_emb->weight); }

torch::Tensor Bert::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  if (const int64_t fused = fused_loss_chunk_tokens(tok_emb->weight.size(0), tok_emb->weight.size(1), input.device().type())) {
    // Only the masked tokens reach the head (Note [Fused LM loss]): its transform too. Their
    // count is queued before the encoder and read after it, behind the encoder's kernels on a
    // GPU (Note [Counts read behind the queue]); on the CPU rows is nonzero(), as it was.
    lt::recompute::MaskedRows masked(target);
    auto slot = c10::make_intrusive<TiedGradSlot>();
    auto h = hidden(input, slot);
    const auto t = target.reshape({-1});
    const auto rows = masked.indices();
    const auto hv = h.reshape({-1, h.size(-1)}).index_select(0, rows);
    return fused_linear_cross_entropy(mlm->transform(hv), tok_emb->weight, mlm->bias, t.index_select(0, rows), fused,
                                      head_matmul(), slot);
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
