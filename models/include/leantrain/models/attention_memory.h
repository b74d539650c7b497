#pragma once
// The analytic attention term of the planner's memory model (docs/PLANNER.md, Note [Attention
// memory term] in models/src/attention_memory.cpp): the bytes of the [B,H,T,T] tensors a
// transformer's attention cores hold in a training step, per sample, for a device, an
// activation dtype and a recompute policy. Zero where a fused SDPA kernel runs (it keeps q, k,
// v, its output and a [B,H,T] logsumexp instead); n_layer x n_head x T^2 x the bytes the plain
// core keeps per score where the plain core runs (model.attention = "plain", or "sdpa" where no
// fused kernel takes the inputs: attention dropout on the CPU).
#include <cstdint>
#include <string>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include "leantrain/models/model_config.h"
#include "leantrain/recompute/recompute.h"

namespace lt::models {

struct AttentionMemory {
  bool has_attention = false;  // false: the model has no attention cores (every number below is 0)
  bool fused = false;          // a fused SDPA kernel runs: no [B,H,T,T] tensor exists
  // What runs: "plain", "sdpa: flash attention", "sdpa: math, so the plain core", ... (empty
  // without attention).
  std::string core;
  int64_t layers = 0, heads = 0, seq_len = 0;
  // Bytes the plain core keeps for backward per attention score (per element of one layer's
  // [H,T,T] per sample): the softmax output, and with dropout the noise or mask and the dropped
  // probabilities, in the dtypes autocast gives them on this device (0 when fused).
  double kept_bytes_per_score = 0;
  // Under selective with dropout on the CPU: the dropout mask kept as bits per score (Note
  // [Dropout masks kept as bits] in recompute/src/recompute.cpp), 1/8; 0 otherwise.
  double bits_bytes_per_score = 0;
  int64_t kept_layers = 0;   // layers whose cores keep their tensors from forward to backward
  int64_t rerun_layers = 0;  // 1 when a rerun in backward adds a layer to what the kept ones hold (full, selective), else 0
  // The most [B,H,T,T] bytes alive at once in a training step, per sample:
  //   H x T^2 x (kept_layers x kept + rerun_layers x kept + (selective) layers x bits).
  // none: layers x H x T^2 x kept; full: one layer's rerun; 0 when fused.
  int64_t bytes_per_sample = 0;
  // What one layer's core adds on top for a moment, per score: two [B,H,T,T] tensors of the
  // activation dtype (QK^T and its scaled copy in the forward; in the backward the gradient of
  // the probabilities and softmax's gradient, while every kept tensor is still alive).
  double transient_bytes_per_score = 0;
  // bytes_per_sample + H x T^2 x transient: the [B,H,T,T] bytes a training step certainly
  // holds at once at its worst moment, per sample (the planner's floor; 0 when fused).
  int64_t floor_bytes_per_sample = 0;
  // `selective` keeps exactly what `none` keeps: the fused kernel never runs through the
  // attention core's recompute region (Note [Selective recompute under SDPA] in transformer.cpp).
  bool selective_is_none = false;
};

/// The attention memory of a GPT (causal) or BERT (bidirectional) of `cfg` training on `device`
/// with activations of `dtype` (the autocast dtype: kBFloat16 / kHalf, else kFloat) under
/// `policy`. Asks LibTorch which SDPA kernel runs (sdpa_runs_fused on a [1,H,T,D/H] tensor of
/// that device and dtype: it allocates one).
AttentionMemory transformer_attention_memory(const ModelConfig& cfg, bool causal, const c10::Device& device,
                                             c10::ScalarType dtype, const recompute::RecomputePolicy& policy);

/// One line for logs and tables, e.g. "plain: 48.00 MiB/sample of [B,H,T,T] (12 layers x 12 heads x
/// 1024^2 x 4 B)" or "sdpa: flash attention: no [B,H,T,T] tensors".
std::string describe(const AttentionMemory& m);

}  // namespace lt::models
