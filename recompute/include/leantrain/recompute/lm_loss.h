#pragma once
// The language-model head fused with its cross-entropy (Note [Fused LM loss] in
// recompute/src/lm_loss.cpp).
#include <optional>

#include <torch/types.h>

#include "leantrain/recompute/host_readback.h"

namespace lt::recompute {

/// The target value language-model losses skip (torch's cross_entropy ignore_index).
constexpr int64_t kIgnoreIndex = -100;

/// Mean cross-entropy of linear(hidden, weight, bias) against target over the tokens whose
/// target is not kIgnoreIndex, as torch cross_entropy on the logits in fp32 would give it,
/// without the [N,V] logits: chunks of `chunk_tokens` rows compute their logits, loss and
/// the gradients of hidden, weight and bias in forward; backward scales those by the
/// incoming gradient. hidden [..., D], weight [V, D], bias [V] or undefined, target [...].
/// The matmuls run in the autocast dtype of hidden's device when autocast is on (else in
/// hidden's dtype); the softmax and the sums in fp32.
/// How the fused head's three products run under bf16 autocast (precision.head_matmul;
/// Note [Head products in fp32 where bf16 GEMMs are slow] in lm_loss.cpp):
///  - kAuto: as kFp32 on an x86 CPU without AMX-BF16 (oneDNN's bf16 GEMM there runs below its
///    fp32 GEMM), else as kAutocast;
///  - kAutocast: in the autocast dtype, as the plain head's autocast linear;
///  - kFp32: fp32 GEMMs of the bf16-rounded weight and hidden and the fp32 logit gradient.
/// Without autocast (fp32) all three are the same.
enum class HeadMatmul { kAuto, kAutocast, kFp32 };
/// "auto" | "autocast" | "fp32"; throws ConfigError naming precision.head_matmul otherwise.
HeadMatmul parse_head_matmul(const std::string& text);
/// The same values for ResNet's convolutions (precision.conv_products; conv_products.h);
/// throws ConfigError naming precision.conv_products otherwise.
HeadMatmul parse_conv_products(const std::string& text);
/// Whether the products run in fp32 under `choice` for a head computing in `compute` on `device`.
bool head_products_in_fp32(HeadMatmul choice, c10::ScalarType compute, c10::DeviceType device);
/// This CPU: x86 without AMX-BF16 (cpuid), where kAuto picks fp32.
bool cpu_bf16_gemm_is_slow();

/// Where a fused head's backward leaves its weight gradient for the embedding tied to that
/// weight (Note [Tied embedding's gradient added into the head's] in lm_loss.cpp): one per
/// forward, handed to tied_embedding and fused_linear_cross_entropy.
struct TiedGradSlot : torch::CustomClassHolder {
  torch::Tensor grad;
};

/// torch::embedding(weight, ids) (no padding index, no scaling by frequency) whose backward,
/// when `slot` holds the weight gradient the fused head computed in the same backward, adds
/// its rows into that tensor and returns none; else the dense gradient as torch::embedding's.
/// `sync_free` (unset: on any device but the CPU): the rows are added without grouping them
/// by token first, which would read the number of distinct tokens on the host (Note [Fused LM
/// loss without host syncs] in lm_loss.cpp); the same sums up to rounding.
torch::Tensor tied_embedding(const torch::Tensor& weight, const torch::Tensor& ids,
                             const c10::intrusive_ptr<TiedGradSlot>& slot, std::optional<bool> sync_free = std::nullopt);

/// `sync_free` (unset: on any device but the CPU): no host synchronisation; the rows whose
/// target is ignored run through the head with a weight of 0 instead of being dropped, which
/// needs their number on the host (Note [Fused LM loss without host syncs]). The same loss and
/// gradients up to fp32 rounding; the CPU's default path is bitwise what it was.
torch::Tensor fused_linear_cross_entropy(const torch::Tensor& hidden, const torch::Tensor& weight,
                                         const torch::Tensor& bias, const torch::Tensor& target,
                                         int64_t chunk_tokens, HeadMatmul matmul = HeadMatmul::kAuto,
                                         const c10::intrusive_ptr<TiedGradSlot>& slot = {},
                                         std::optional<bool> sync_free = std::nullopt);

/// The rows of `target` (flattened) that are not kIgnoreIndex, ascending: what
/// (target != kIgnoreIndex).nonzero().squeeze(1) gives. `sync_free` (unset: on any device but
/// the CPU): construction queues the count of those rows and its copy to the host; indices(),
/// called after other work was queued (a masked LM's encoder), waits for that copy only and
/// sizes nonzero_static with it, so the stream is never drained (Note [Counts read behind the
/// queue], host_readback.cpp). Otherwise indices() is nonzero().
class MaskedRows {
 public:
  explicit MaskedRows(const torch::Tensor& target, std::optional<bool> sync_free = std::nullopt);
  torch::Tensor indices();

 private:
  torch::Tensor valid_;
  bool sync_free_;
  HostReadback count_;
};

/// Whether the fused loss is used for a training forward on `device` right now: grad mode
/// on and autocast not in fp16 (fp16's gradients computed before the loss scale is applied
/// could underflow; fp16 keeps the plain or recomputed-chunk loss).
bool fused_lm_loss_applies(c10::DeviceType device);

/// Rows per chunk so that one chunk's fp32 logits take about 64 MiB (at least 64): the
/// recomputed chunks of Note [Chunked LM loss].
int64_t lm_loss_chunk_tokens(int64_t vocab);

/// Rows per chunk of the fused loss for a [vocab, dim] head: one chunk's fp32 logits take at
/// most what the head's fp32 weight gradient takes, and at least 64 MiB; so max(dim, 64 MiB of
/// rows) (Note [Fused LM loss chunks]).
int64_t fused_lm_loss_chunk_tokens(int64_t vocab, int64_t dim);

}  // namespace lt::recompute
