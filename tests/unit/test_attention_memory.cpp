// The planner's analytic attention term (models/include/leantrain/models/attention_memory.h,
// Note [Attention memory term]): its numbers for plain and SDPA cores under each policy and
// dtype, through the model registry, and against the bytes the tracking allocator sees the
// attention core and a GPT keep from forward to backward.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <string>

#include "leantrain/models/attention.h"
#include "leantrain/models/attention_memory.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/memory_meter.h"

namespace {

using lt::models::AttentionImpl;
using lt::models::AttentionMemory;
using lt::recompute::RecomputePolicy;

lt::models::ModelConfig gpt(const std::string& attention, double dropout = 0.0) {
  lt::models::ModelConfig c;
  c.kind = "gpt";
  c.vocab_size = 64;
  c.seq_len = 1024;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.dropout = dropout;
  c.attention = attention;
  return c;
}

AttentionMemory term(const lt::models::ModelConfig& c, c10::ScalarType dtype, const std::string& policy) {
  return lt::models::attention_memory(lt::models::builtin_model_section(c), c10::Device(c10::kCPU), dtype,
                                      RecomputePolicy::parse(policy));
}

constexpr int64_t kScores = 4LL * 1024 * 1024;  // n_head x T^2 of gpt()

TEST(AttentionTerm, PlainKeepsLayersTimesHeadsTimesSeqSquaredTimesItsBytes) {
  const auto c = gpt("plain");
  // none: every layer keeps the softmax output, fp32: 2 x 4 x 1024^2 x 4 = 32 MiB per sample.
  const auto none = term(c, c10::kFloat, "none");
  EXPECT_TRUE(none.has_attention);
  EXPECT_FALSE(none.fused);
  EXPECT_FALSE(none.selective_is_none);
  EXPECT_EQ(none.core, "plain");
  EXPECT_EQ(none.kept_bytes_per_score, 4.0);
  EXPECT_EQ(none.kept_layers, 2);
  EXPECT_EQ(none.bytes_per_sample, 2 * kScores * 4);
  EXPECT_EQ(none.bytes_per_sample, 33554432);
  // The floor adds one layer's two transient [H,T,T] tensors (Note [Attention memory term]).
  EXPECT_EQ(none.transient_bytes_per_score, 8.0);
  EXPECT_EQ(none.floor_bytes_per_sample, 2 * kScores * 4 + 2 * kScores * 4);
  // bf16 autocast on the CPU: softmax stays bf16.
  EXPECT_EQ(term(c, c10::kBFloat16, "none").bytes_per_sample, 2 * kScores * 2);
  // Recompute policies: one layer's rerun at a time.
  EXPECT_EQ(term(c, c10::kFloat, "selective").bytes_per_sample, kScores * 4);
  EXPECT_EQ(term(c, c10::kFloat, "full").bytes_per_sample, kScores * 4);
  // block 0 recomputed, block 1 (the last) keeps, and lets go before block 0's rerun.
  const auto every2 = term(c, c10::kFloat, "every:2");
  EXPECT_EQ(every2.kept_layers, 1);
  EXPECT_EQ(every2.rerun_layers, 0);
  EXPECT_EQ(every2.bytes_per_sample, kScores * 4);
  // With dropout on the CPU: softmax output, noise and dropped probabilities, 3 x 4 bytes; under
  // selective the masks of both layers stay as bits (1/8 byte a score).
  const auto d = gpt("plain", 0.1);
  EXPECT_EQ(term(d, c10::kFloat, "none").bytes_per_sample, 2 * kScores * 12);
  EXPECT_EQ(term(d, c10::kFloat, "selective").bytes_per_sample, kScores * 12 + 2 * kScores / 8);
  EXPECT_EQ(term(d, c10::kBFloat16, "none").bytes_per_sample, 2 * kScores * 6);
  // BERT: the same count, bidirectional.
  auto b = gpt("plain");
  b.kind = "bert";
  EXPECT_EQ(term(b, c10::kFloat, "none").bytes_per_sample, 2 * kScores * 4);
}

TEST(AttentionTerm, FusedSdpaHasNoneAndItsSelectiveIsNone) {
  for (const char* policy : {"none", "selective", "full", "every:2"})
    for (const auto dtype : {c10::kFloat, c10::kBFloat16}) {
      const auto m = term(gpt("sdpa"), dtype, policy);
      EXPECT_TRUE(m.fused) << policy;
      EXPECT_TRUE(m.selective_is_none) << policy;
      EXPECT_EQ(m.core, "sdpa: flash attention") << policy;
      EXPECT_EQ(m.bytes_per_sample, 0) << policy;
      EXPECT_EQ(m.floor_bytes_per_sample, 0) << policy;
    }
  auto b = gpt("sdpa");
  b.kind = "bert";
  EXPECT_EQ(term(b, c10::kFloat, "none").bytes_per_sample, 0);
  // Attention dropout on the CPU: no fused kernel, so sdpa runs the plain core and keeps its tensors.
  const auto d = term(gpt("sdpa", 0.1), c10::kFloat, "none");
  EXPECT_FALSE(d.fused);
  EXPECT_FALSE(d.selective_is_none);
  EXPECT_EQ(d.core, "sdpa: math, so the plain core");
  EXPECT_EQ(d.bytes_per_sample, 2 * kScores * 12);
  // Kinds without attention have no term.
  lt::models::ModelConfig mlp;
  EXPECT_FALSE(term(mlp, c10::kFloat, "none").has_attention);
  EXPECT_EQ(term(mlp, c10::kFloat, "none").bytes_per_sample, 0);
  EXPECT_EQ(lt::models::describe(term(mlp, c10::kFloat, "none")), "no attention");
  EXPECT_EQ(lt::models::describe(term(gpt("plain"), c10::kFloat, "none")),
            "plain: 32.00 MiB/sample of [B,H,T,T] (2+0 layers x 4 heads x 1024^2 x 4 B)");
}

// The bytes the attention core keeps from its forward to its backward (its output, which the
// caller's projection keeps anyway, not counted), q, k, v being leaves allocated before.
int64_t core_kept(AttentionImpl impl, double dropout, bool bf16, int64_t b, int64_t h, int64_t t, int64_t hd) {
  torch::manual_seed(3);
  auto q = torch::randn({b, h, t, hd}).requires_grad_(true), k = torch::randn({b, h, t, hd}).requires_grad_(true),
       v = torch::randn({b, h, t, hd}).requires_grad_(true);
  lt::MemoryMeter meter(-1);
  const int64_t base = meter.stats().current_bytes;
  torch::Tensor out;
  {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, bf16);
    out = lt::models::attention_core(impl, q, k, v, torch::Tensor(), /*causal=*/true, dropout, /*train=*/true);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  const int64_t kept = meter.stats().current_bytes - base - static_cast<int64_t>(out.nbytes());
  out.sum().backward();
  return kept;
}

// The term's per-score bytes are what the core keeps, measured: plain minus fused SDPA (which
// keeps no [B,H,T,T] tensor; both keep the same casts of q, k, v) is B x H x T^2 x kept, plus
// the plain core's bool [T,T] causal mask (per layer, not per sample: not in the term), less
// the fused kernel's fp32 [B,H,T] logsumexp — to the byte.
TEST(AttentionTerm, KeptBytesPerScoreAreWhatTheCoreKeeps) {
  const int64_t b = 2, h = 4, t = 512, hd = 16;
  const double scores = static_cast<double>(b * h * t * t);
  for (const bool bf16 : {false, true}) {
    const auto dtype = bf16 ? c10::kBFloat16 : c10::kFloat;
    auto c = gpt("plain");
    c.seq_len = t;
    c.n_head = h;
    c.d_model = h * hd;
    const int64_t fused = core_kept(AttentionImpl::kSdpa, 0.0, bf16, b, h, t, hd);
    for (const double p : {0.0, 0.1}) {
      c.dropout = p;
      const double kept = term(c, dtype, "none").kept_bytes_per_score;
      const double measured = static_cast<double>(core_kept(AttentionImpl::kPlain, p, bf16, b, h, t, hd) - fused);
      const double mask = static_cast<double>(t * t), logsumexp = static_cast<double>(b * h * t * 4);
      EXPECT_EQ(measured, scores * kept + mask - logsumexp)
          << (bf16 ? "bf16" : "fp32") << " dropout " << p << ": measured " << measured / scores << " bytes a score";
    }
  }
}

// Bytes a GPT keeps from forward_loss to backward (the tracking allocator), batch of b.
int64_t gpt_kept(const lt::models::ModelConfig& c, int64_t b) {
  torch::manual_seed(1);
  auto model = lt::models::build_model(c);
  model->train();
  auto x = torch::randint(0, c.vocab_size, {b, c.seq_len}), y = torch::randint(0, c.vocab_size, {b, c.seq_len});
  lt::MemoryMeter meter(-1);
  const int64_t base = meter.stats().current_bytes;
  auto loss = model->forward_loss(x, y);
  const int64_t kept = meter.stats().current_bytes - base;
  loss.backward();
  return kept;
}

// A whole GPT: plain keeps the term x B more than SDPA from forward to backward, and per layer
// the causal mask less the logsumexp (as above) — to the byte.
TEST(AttentionTerm, AGptKeepsItsTermPerSampleMoreWithPlainThanWithSdpa) {
  auto c = gpt("plain");
  c.seq_len = 512;
  const int64_t b = 2;
  const int64_t t = term(c, c10::kFloat, "none").bytes_per_sample;
  EXPECT_EQ(t, 2LL * 4 * 512 * 512 * 4);
  const int64_t plain = gpt_kept(c, b);
  c.attention = "sdpa";
  const int64_t sdpa = gpt_kept(c, b);
  const int64_t per_layer = 512 * 512 - b * 4 * 512 * 4;
  EXPECT_EQ(plain - sdpa, t * b + 2 * per_layer) << "plain " << plain << " sdpa " << sdpa;
}

}  // namespace
