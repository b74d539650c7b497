// The analytic attention term of the planner's memory model (attention_memory.h).
#include "leantrain/models/attention_memory.h"

#include <cmath>
#include <cstdio>

#include <torch/torch.h>

#include "leantrain/models/attention.h"

namespace lt::models {

// Note [Attention memory term]
// What the attention core (attention_core in transformer.cpp) holds per layer in a training
// step, per sample, counted in elements of one [H,T,T] (a "score"):
//  - a fused SDPA kernel (flash / memory-efficient / cuDNN): nothing of that size; it keeps
//    q, k, v, its output and a [B,H,T] fp32 logsumexp, all linear in T and already in what the
//    probes measure per sample.
//  - the plain core (model.attention = "plain", or "sdpa" where no fused kernel takes the
//    inputs: on the CPU any attention dropout, Note [SDPA's math fallback]): QK^T, its scaled
//    copy and the masked scores are freed as the next op runs (masked_fill keeps only the
//    bool [T,T] mask); the softmax output P is kept (softmax's backward needs it, and so
//    does P @ V when there is no dropout). Its dtype is the activation dtype — on the CPU
//    autocast leaves softmax in bf16/fp16, measured: 96 MiB a layer for B 4, H 12, T 1024 in
//    bf16 (docs/PRECISION_AND_MEMORY.md) — except on CUDA, where autocast runs softmax in fp32
//    and P @ V keeps a bf16/fp16 cast of P as well (4 + 2 bytes).
//    With dropout p > 0: the CPU's dropout (ATen's _dropout_impl) keeps its noise, the
//    input's dtype, and P @ V keeps the dropped probabilities: 3 tensors of the activation
//    dtype. CUDA's fused dropout keeps a bool mask (1 byte) and P @ V the dropped
//    probabilities (their bf16/fp16 cast under autocast, else fp32).
// Per policy (the default Model::apply_recompute; GPT and BERT mark their cores cheap):
//  - none: every layer keeps its core's tensors until its backward: layers x kept.
//  - selective: the core is recomputed in backward, one layer at a time: one layer's kept
//    tensors exist again during its backward, and under dropout on the CPU every layer keeps
//    its mask as bits (1/8 byte a score) until then: kept + layers x bits.
//  - full: every block is recomputed: one layer's rerun, kept.
//  - every:K: the blocks 0, K, 2K, ... are recomputed: the others keep theirs, plus one rerun.
// The sum is what the cores hold for backward at once: at the end of the forward (none), or
// in the backward of the first recomputed block (bytes_per_sample, the term plan.json
// records). On top of it one layer's core briefly holds two more [B,H,T,T] tensors of the
// activation dtype: QK^T and its scaled copy in the forward, and in the backward the
// gradient of the probabilities (from P @ V's backward) and softmax's gradient of it, while
// that layer's P is still kept (transient_bytes_per_score). Kept + transient
// (floor_bytes_per_sample) is a lower bound on the per-sample growth of a step's peak, which
// also holds the fixed part (parameters, gradients, optimizer state) at that moment; the
// planner prunes with it before probing (Note [Attention floor] in trainers/src/planner.cpp).
// Measured on GPT 2 layers, d 64, 4 heads, T 1024 (probe peaks of docs/PLANNER.md "Long
// sequences"): the floor was 88-94 % of every measured peak. Not counted: the plain core's
// bool [T,T] causal mask, T^2 bytes a layer whatever the batch. A fused kernel
// runs the same under every policy, and `selective` then keeps exactly what `none` keeps
// (Note [Selective recompute under SDPA] in transformer.cpp).

namespace {

std::string mib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / (1024.0 * 1024.0));
  return buf;
}

}  // namespace

AttentionMemory transformer_attention_memory(const ModelConfig& cfg, bool causal, const c10::Device& device,
                                             c10::ScalarType dtype, const recompute::RecomputePolicy& policy) {
  AttentionMemory m;
  m.has_attention = true;
  m.layers = cfg.n_layer;
  m.heads = cfg.n_head;
  m.seq_len = cfg.seq_len;
  const AttentionImpl impl = parse_attention(cfg.attention);
  const double p = cfg.dropout;  // attention dropout in training (GPT and BERT use model.dropout)
  if (impl == AttentionImpl::kSdpa) {
    // What attention_core asks: a fused kernel for these inputs in training.
    torch::NoGradGuard no_grad;
    auto q = torch::empty({1, cfg.n_head, cfg.seq_len, cfg.d_model / cfg.n_head},
                          torch::TensorOptions().dtype(dtype).device(device))
                 .requires_grad_(true);
    m.fused = sdpa_runs_fused(q, q, q, torch::Tensor(), causal, p);
    m.core = "sdpa: " + sdpa_backend(q, q, q, torch::Tensor(), causal, p) + (m.fused ? "" : ", so the plain core");
  } else {
    m.core = "plain";
  }
  m.selective_is_none = m.fused;
  if (m.fused) return m;

  const bool cuda = device.is_cuda();
  const bool low = dtype == c10::kBFloat16 || dtype == c10::kHalf;
  const double e = static_cast<double>(c10::elementSize(dtype));
  const double probs = cuda && low ? 4.0 : e;  // softmax's output, kept by its backward
  if (p > 0.0)
    m.kept_bytes_per_score = cuda ? probs + 1.0 + (low ? e : 4.0) : 3.0 * e;
  else
    m.kept_bytes_per_score = probs + (cuda && low ? e : 0.0);

  using Kind = recompute::RecomputePolicy::Kind;
  switch (policy.kind) {
    case Kind::kNone: m.kept_layers = m.layers; break;
    case Kind::kSelective:
      m.rerun_layers = 1;
      m.bits_bytes_per_score = p > 0.0 && device.is_cpu() ? 1.0 / 8.0 : 0.0;
      break;
    case Kind::kFull: m.rerun_layers = 1; break;  // the last block kept, or one rerun: one layer at a time
    case Kind::kEvery: {
      int64_t rerun = 0;
      for (int64_t i = 0; i < m.layers; ++i)
        rerun += policy.recomputes_block(static_cast<size_t>(i), static_cast<size_t>(m.layers)) ? 1 : 0;
      // The last block is kept (Note [The last block is not recomputed]); a rerun starts
      // after its backward has let its activations go, so no rerun adds to the kept layers.
      m.kept_layers = m.layers - rerun;
      m.rerun_layers = 0;
      break;
    }
  }
  const double scores = static_cast<double>(m.heads) * static_cast<double>(m.seq_len) * static_cast<double>(m.seq_len);
  const double bits_layers = policy.kind == Kind::kSelective ? static_cast<double>(m.layers) : 0.0;
  m.bytes_per_sample = static_cast<int64_t>(std::llround(
      scores * (static_cast<double>(m.kept_layers + m.rerun_layers) * m.kept_bytes_per_score +
                bits_layers * m.bits_bytes_per_score)));
  m.transient_bytes_per_score = 2.0 * e;
  m.floor_bytes_per_sample = m.bytes_per_sample + static_cast<int64_t>(std::llround(scores * m.transient_bytes_per_score));
  return m;
}

std::string describe(const AttentionMemory& m) {
  if (!m.has_attention) return "no attention";
  if (m.fused) return m.core + ": no [B,H,T,T] tensors";
  char buf[160];
  std::snprintf(buf, sizeof buf, " (%lld+%lld layers x %lld heads x %lld^2 x %g B", static_cast<long long>(m.kept_layers),
                static_cast<long long>(m.rerun_layers), static_cast<long long>(m.heads),
                static_cast<long long>(m.seq_len), m.kept_bytes_per_score);
  std::string s = m.core + ": " + mib(static_cast<double>(m.bytes_per_sample)) + "/sample of [B,H,T,T]" + buf;
  if (m.bits_bytes_per_score > 0) s += ", + dropout bits of " + std::to_string(m.layers) + " layers";
  return s + ")";
}

}  // namespace lt::models
