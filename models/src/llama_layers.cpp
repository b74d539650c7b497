// The Llama family's layers (llama.h): RMSNorm, RoPE, grouped-query attention, the SwiGLU MLP.
#include <cmath>
#include <optional>

#include <ATen/SDPBackend.h>
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <torch/torch.h>

#include "leantrain/models/llama.h"
#include "leantrain/recompute/recompute.h"

namespace lt::models {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// ---- RMSNorm ----

// Note [RMSNorm keeps its input and rsqrt]
// Hugging Face's RMSNorm, weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype), as autograd
// records it keeps x32 (pow's and the product's input: x itself when x is fp32, an fp32 copy
// otherwise), the [..,1] rsqrt and the normalised x.to(x.dtype) (for the weight's gradient).
// RmsNormFn runs the same forward ops (bitwise the same values) and keeps x and the rsqrt:
// one tensor of x's size less per norm (two per block, more under autocast), for one more
// elementwise pass in backward, which computes the normalised x again and differentiates the
// expression by hand. Its gradients are those of the expression
// up to rounding (not bitwise autograd's: the Hugging Face parity tests compare within 1e-5),
// and the same under every recompute policy, which all run this function.
// out_dtype casts the output once to the dtype the projections after it would cast it to
// under autocast, so q_proj, k_proj and v_proj (gate_proj and up_proj) share one low-precision
// copy instead of keeping one each: the same values they would have cast.
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& weight, double eps,
                               int64_t out_dtype) {
    const auto x32 = x.to(torch::kFloat);
    const auto r = torch::rsqrt(x32.pow(2).mean(-1, /*keepdim=*/true) + eps);
    auto y = weight * (x32 * r).to(x.scalar_type());
    ctx->saved_data["y_dtype"] = static_cast<int64_t>(y.scalar_type());
    if (out_dtype >= 0) y = y.to(static_cast<c10::ScalarType>(out_dtype));
    ctx->save_for_backward({x, weight, r});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& r = saved[2];
    const auto gy = grad_out[0].to(static_cast<c10::ScalarType>(ctx->saved_data["y_dtype"].toInt()));
    const auto x32 = x.to(torch::kFloat);
    torch::Tensor grad_x, grad_w;
    if (ctx->needs_input_grad(1))
      grad_w = at::sum_to(gy * (x32 * r).to(x.scalar_type()), weight.sizes()).to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      const auto g = (gy * weight).to(x.scalar_type()).to(torch::kFloat);  // d loss / d (x32 * r)
      // Through r = rsqrt(mean(x32^2) + eps): dr = -r^3/2 d(mean), d(mean)/dx32 = 2 x32 / n.
      const auto grad_r = (g * x32).sum(-1, /*keepdim=*/true);
      const auto coeff = grad_r * r.pow(3) * (-1.0 / static_cast<double>(x.size(-1)));
      grad_x = (g * r + x32 * coeff).to(x.scalar_type());
    }
    return {grad_x, grad_w, torch::Tensor(), torch::Tensor()};
  }
};

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x, std::optional<c10::ScalarType> out_dtype) {
  return RmsNormFn::apply(x, weight, eps_, out_dtype ? static_cast<int64_t>(*out_dtype) : int64_t{-1});
}

// ---- RoPE ----

// The ops of Hugging Face's _compute_default_rope_parameters and _compute_llama3_parameters
// (modeling_rope_utils.py), in fp32: `s / t` in Python is t.reciprocal() * s.
torch::Tensor rope_inv_freq(const LlamaConfig& cfg) {
  torch::NoGradGuard no_grad;
  const int64_t dim = cfg.head_size();
  const auto exponent = torch::arange(0, dim, 2, torch::kLong).to(torch::kFloat) / dim;
  auto inv_freq = torch::pow(cfg.rope_theta, exponent).reciprocal();
  if (cfg.rope_scaling != "llama3") return inv_freq;
  const double factor = cfg.rope_factor, low = cfg.rope_low_freq_factor, high = cfg.rope_high_freq_factor;
  const int64_t old_context = cfg.rope_original_max_position_embeddings;
  const double low_wavelen = static_cast<double>(old_context) / low;
  const double high_wavelen = static_cast<double>(old_context) / high;
  const auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  auto scaled = torch::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
  const auto smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
  const auto smoothed = torch::rsub(smooth, 1) * scaled / factor + smooth * scaled;
  const auto medium = (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

std::pair<torch::Tensor, torch::Tensor> RopeTables::get(int64_t t, const c10::Device& device, c10::ScalarType dtype) {
  TORCH_CHECK(t <= seq_len_, "RoPE: ", t, " positions, the tables hold model.seq_len = ", seq_len_);
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_pair(device.str(), dtype);
  for (const auto& [k, tables] : cache_)
    if (k == key) return {tables.first.narrow(0, 0, t), tables.second.narrow(0, 0, t)};
  // As LlamaRotaryEmbedding.forward: fp32 with autocast off, then cast to the hidden states' dtype.
  torch::NoGradGuard no_grad;
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto pos = torch::arange(seq_len_, torch::TensorOptions().dtype(torch::kLong).device(device)).to(torch::kFloat);
  const auto freqs = pos.unsqueeze(1) * inv_freq_.to(device).unsqueeze(0);  // [S, h/2]
  const auto emb = torch::cat({freqs, freqs}, -1);
  cache_.push_back({key, {emb.cos().to(dtype), emb.sin().to(dtype)}});
  const auto& tables = cache_.back().second;
  return {tables.first.narrow(0, 0, t), tables.second.narrow(0, 0, t)};
}

namespace {

torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// x [B,T,heads,h], cos/sin [T,h]: apply_rotary_pos_emb's expression. Autograd keeps cos and sin
// (the products' other operands), not x.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  return x * cos.unsqueeze(1) + rotate_half(x) * sin.unsqueeze(1);
}

// ---- grouped-query attention ----

// Note [Grouped-query attention through SDPA]
// K < H key/value heads, each shared by H/K consecutive query heads (Hugging Face's repeat_kv
// is repeat_interleave on the head dimension). at::scaled_dot_product_attention takes k and v
// with K heads when enable_gqa is set (LibTorch 2.5+; this build's signature has it), and its
// fused kernels that take GQA (flash attention on the CPU and CUDA, cuDNN) read each k/v head for
// its group without a repeated copy: backward keeps q [B,H,T,h], k and v [B,K,T,h], the output
// and a logsumexp. The choice is asked with enable_gqa as SDPA asks it (at::_fused_sdp_choice).
// Where no fused kernel takes GQA (on CUDA the memory-efficient kernel does not: fp32, or GPUs
// without flash attention such as Turing's) k and v are repeated to H heads, [B,H,T,h] copies
// kept for backward, for a fused kernel that takes those; and where none takes even those
// ("math": attention dropout on the CPU) the plain core runs on the repeated k and v, as GPT's
// does (Note [SDPA's math fallback] in transformer.cpp). compute_note says which.
bool uses_gqa(const torch::Tensor& q, const torch::Tensor& k) { return k.size(1) != q.size(1); }

at::SDPBackend sdpa_choice(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double p) {
  return static_cast<at::SDPBackend>(
      at::_fused_sdp_choice(q, k, v, std::nullopt, p, /*is_causal=*/true, std::nullopt, uses_gqa(q, k)));
}

std::string kernel_name(at::SDPBackend b) {
  switch (b) {
    case at::SDPBackend::flash_attention: return "flash attention";
    case at::SDPBackend::efficient_attention: return "memory-efficient";
    case at::SDPBackend::cudnn_attention: return "cuDNN";
    case at::SDPBackend::math: return "math";
    case at::SDPBackend::overrideable: return "overrideable";
    default: return "none (no kernel takes these inputs)";
  }
}

// q [B,H,T,h], k and v [B,K,T,h] -> [B,H,T,h], causal.
torch::Tensor gqa_attention_core(AttentionImpl impl, const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, double dropout_p, bool train) {
  const bool gqa = uses_gqa(q, k);
  const double p = train ? dropout_p : 0.0;
  if (impl == AttentionImpl::kSdpa && sdpa_choice(q, k, v, p) != at::SDPBackend::math)
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, p, /*is_causal=*/true, std::nullopt, gqa);
  auto kr = k, vr = v;
  if (gqa) {
    const int64_t rep = q.size(1) / k.size(1);
    kr = k.repeat_interleave(rep, 1);
    vr = v.repeat_interleave(rep, 1);
    if (impl == AttentionImpl::kSdpa && sdpa_choice(q, kr, vr, p) != at::SDPBackend::math)
      return at::scaled_dot_product_attention(q, kr, vr, std::nullopt, p, /*is_causal=*/true);
  }
  return attention_core(AttentionImpl::kPlain, q, kr, vr, torch::Tensor(), true, dropout_p, train);
}

torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

}  // namespace

GqaKernel gqa_sdpa_backend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p) {
  const auto direct = sdpa_choice(q, k, v, dropout_p);
  if (direct != at::SDPBackend::math || !uses_gqa(q, k)) return {kernel_name(direct), false};
  // q stands in for k and v repeated to its heads: the same shape, dtype and device.
  return {kernel_name(sdpa_choice(q, q, q, dropout_p)), true};
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& cfg)
    : heads_(cfg.num_attention_heads), kv_heads_(cfg.kv_heads()), head_dim_(cfg.head_size()), dropout_(cfg.dropout),
      impl_(parse_attention(cfg.attention)) {
  const int64_t d = cfg.hidden_size;
  q_proj = register_module("q_proj", linear(d, heads_ * head_dim_, cfg.attention_bias));
  k_proj = register_module("k_proj", linear(d, kv_heads_ * head_dim_, cfg.attention_bias));
  v_proj = register_module("v_proj", linear(d, kv_heads_ * head_dim_, cfg.attention_bias));
  o_proj = register_module("o_proj", linear(heads_ * head_dim_, d, false));
  if (cfg.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNormImpl>(head_dim_, cfg.rms_norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNormImpl>(head_dim_, cfg.rms_norm_eps));
  }
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const int64_t b = x.size(0), t = x.size(1);
  auto q = q_proj(x).view({b, t, heads_, head_dim_});
  auto k = k_proj(x).view({b, t, kv_heads_, head_dim_});
  auto v = v_proj(x).view({b, t, kv_heads_, head_dim_});
  const auto dtype = v.scalar_type();  // the projections' (autocast's) dtype
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  // RoPE in the dtype Hugging Face computes it in (fp32 under autocast, where cos/sin are the
  // fp32 hidden states' dtype), then the projections' dtype, which SDPA's autocast casts to.
  q = apply_rope(q, cos, sin).to(dtype).transpose(1, 2);  // [B,H,T,h]
  k = apply_rope(k, cos, sin).to(dtype).transpose(1, 2);  // [B,K,T,h]
  v = v.transpose(1, 2);
  const double p = dropout_;
  const bool train = is_training();
  const AttentionImpl impl = impl_;
  auto core = [impl, p, train](const std::vector<torch::Tensor>& in) {
    return gqa_attention_core(impl, in[0], in[1], in[2], p, train);
  };
  // Note [Selective recompute under SDPA] (transformer.cpp): a fused kernel keeps no [B,H,T,T].
  const bool through_region =
      core_region_.recompute() && torch::GradMode::is_enabled() &&
      (impl_ == AttentionImpl::kPlain || gqa_sdpa_backend(q, k, v, train ? p : 0.0).kernel == "math");
  auto y = through_region ? core_region_.run(core, {q, k, v}) : core({q, k, v});
  return o_proj(y.transpose(1, 2).reshape({b, t, heads_ * head_dim_}));
}

std::string LlamaAttentionImpl::backend(const c10::Device& device, c10::ScalarType dtype, int64_t seq_len,
                                        bool training) const {
  const bool gqa = kv_heads_ != heads_;
  const std::string repeated = gqa ? ", k/v repeated to " + std::to_string(heads_) + " heads" : "";
  if (impl_ == AttentionImpl::kPlain) return "plain (softmax(QK^T)V, [B,H,T,T] probabilities kept" + repeated + ")";
  const auto opts = torch::TensorOptions().dtype(dtype).device(device);
  auto q = torch::empty({1, heads_, seq_len, head_dim_}, opts).requires_grad_(training);
  auto k = torch::empty({1, kv_heads_, seq_len, head_dim_}, opts).requires_grad_(training);
  const double p = training ? dropout_ : 0.0;
  const GqaKernel choice = gqa_sdpa_backend(q, k, k, p);
  const std::string how = !gqa              ? ""
                          : choice.repeated ? repeated + ": no fused kernel takes enable_gqa here"
                                            : " through enable_gqa";
  std::string note = "sdpa: " + choice.kernel + " (LibTorch's choice on " + device.str() + ", " +
                     c10::toString(dtype) + ", causal, " + std::to_string(heads_) + " query / " +
                     std::to_string(kv_heads_) + " key-value heads" +
                     how +                      ", dropout " + std::to_string(p).substr(0, 4) + ")";
  if (choice.kernel == "math")
    note += std::string("; no fused kernel takes these inputs") +
            (device.is_cpu() && p > 0.0 ? " (the CPU's flash kernel takes no dropout: model.dropout = 0 enables it)"
                                        : "") +
            ", so the plain core runs instead of LibTorch's math fallback, keeping the [B,H,T,T] probabilities";
  return note;
}

// ---- the SwiGLU MLP ----

// Note [SwiGLU recomputed in the MLP's backward]
// down(silu(g) * u), g = gate_proj(x), u = up_proj(x), as autograd records it keeps four
// [B,T,F] tensors (F = intermediate_size, 2.7-5.4 x D in the Llama family) from forward to
// backward: g (silu's input), silu(g) and u (the product's operands) and the product a (down's
// input, for its weight gradient). SwiGluDown keeps g and u and down's weight, and backward
// computes silu(g) and a again (elementwise passes over [B,T,F] beside its two matmuls of
// that size), as GeluLinear does for GPT's GELU (Note [GELU recomputed in the MLP's
// backward], transformer.cpp). Forward runs the plain expression's ops (bitwise its values,
// autocast included: torch::nn::functional::linear casts as down_proj would); backward runs
// mm products of the same operands in the dtypes forward computed in (autocast excluded, its
// casts made explicit), silu_backward for silu, so gradients match autograd's up to rounding.
// Every path with a graph runs this function — none, the recomputed blocks' reruns, the last
// block under full — so every policy computes the same gradients bitwise. In a rerun
// (output_read = false) down's product is not computed and the output holds zeros (Note [A
// unit's last product is not rerun]): backward needs only what the function saved.
struct SwiGluDown : torch::autograd::Function<SwiGluDown> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& gate, const torch::Tensor& up,
                               const torch::Tensor& weight, bool output_read) {
    torch::Tensor out;
    c10::ScalarType act;
    if (output_read) {
      const auto a = torch::silu(gate) * up;
      act = a.scalar_type();
      out = torch::nn::functional::linear(a, weight);
    } else {
      act = at::promote_types(gate.scalar_type(), up.scalar_type());
      const auto device = gate.device().type();
      const auto dtype = at::autocast::is_autocast_enabled(device) && at::isFloatingType(act) && act != at::kDouble
                             ? at::autocast::get_autocast_dtype(device)
                             : at::promote_types(act, weight.scalar_type());
      auto sizes = gate.sizes().vec();
      sizes.back() = weight.size(0);
      out = torch::zeros(sizes, gate.options().dtype(dtype));
    }
    ctx->save_for_backward({gate, up, weight});
    ctx->saved_data["act_dtype"] = static_cast<int64_t>(act);
    ctx->saved_data["linear_dtype"] = static_cast<int64_t>(out.scalar_type());
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto& gate = saved[0];
    const auto& up = saved[1];
    const auto& weight = saved[2];
    const auto act = static_cast<c10::ScalarType>(ctx->saved_data["act_dtype"].toInt());
    const auto lin = static_cast<c10::ScalarType>(ctx->saved_data["linear_dtype"].toInt());
    const auto grad = grad_out[0].reshape({-1, weight.size(0)});  // [N,D]
    const auto g = gate.to(act), u = up.to(act);
    const auto s = torch::silu(g);
    torch::Tensor grad_gate, grad_up, grad_w;
    if (ctx->needs_input_grad(2))
      grad_w = grad.t().mm((s * u).to(lin).reshape({-1, weight.size(1)})).to(weight.scalar_type());
    if (ctx->needs_input_grad(0) || ctx->needs_input_grad(1)) {
      const auto grad_a = grad.mm(weight.to(lin)).view(gate.sizes()).to(act);
      if (ctx->needs_input_grad(1)) grad_up = (grad_a * s).to(up.scalar_type());
      if (ctx->needs_input_grad(0)) grad_gate = at::silu_backward(grad_a * u, g).to(gate.scalar_type());
    }
    return {grad_gate, grad_up, grad_w, torch::Tensor()};
  }
};

LlamaMLPImpl::LlamaMLPImpl(int64_t hidden, int64_t intermediate) {
  gate_proj = register_module("gate_proj", linear(hidden, intermediate, false));
  up_proj = register_module("up_proj", linear(hidden, intermediate, false));
  down_proj = register_module("down_proj", linear(intermediate, hidden, false));
}

torch::Tensor LlamaMLPImpl::forward(const torch::Tensor& x) { return run(x, /*output_read=*/true); }

torch::Tensor LlamaMLPImpl::forward_for_gradients(const torch::Tensor& x) { return run(x, /*output_read=*/false); }

torch::Tensor LlamaMLPImpl::run(const torch::Tensor& x, bool output_read) {
  const auto g = gate_proj(x), u = up_proj(x);
  const auto& w = down_proj->weight;
  const bool grad = torch::GradMode::is_enabled() && (g.requires_grad() || u.requires_grad() || w.requires_grad());
  if (!grad || g.dim() < 2) return down_proj(torch::silu(g) * u);
  return SwiGluDown::apply(g, u, w, output_read);
}

}  // namespace lt::models
