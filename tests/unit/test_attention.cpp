// Attention through at::scaled_dot_product_attention against the plain softmax(QK^T)V core
// (models/include/leantrain/models/attention.h, Note [Attention through SDPA]): outputs and
// gradients of the core and of the whole module, causal and bidirectional, with a key-padding
// mask, in fp32 and bf16; GPT and BERT built with either core give the same loss; the kernel
// reported at startup; the activation memory SDPA saves and what `selective` does under it
// (Note [Selective recompute under SDPA]).
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <array>
#include <cstdio>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "leantrain/models/attention.h"
#include "leantrain/models/model.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/memory_meter.h"

namespace {

using lt::models::AttentionImpl;

// max|a-b| / max|ref|, in double: the relative error these tests bound.
double rel_err(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& ref) {
  const double scale = ref.abs().max().item<double>();
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() / (scale > 0 ? scale : 1.0);
}

std::string sci(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2e", x);
  return b;
}

// [B,T] bool, true = a real token: sequence i has its last 3*i positions padded (right padding,
// as a tokenizer pads; every query keeps at least its first key, so no row is all masked).
torch::Tensor right_padding(int64_t b, int64_t t) {
  auto m = torch::ones({b, t}, torch::kBool);
  for (int64_t i = 1; i < b; ++i) m.index_put_({i, torch::indexing::Slice(t - 3 * i, torch::indexing::None)}, false);
  return m;
}

struct CoreResult {
  torch::Tensor out, dq, dk, dv;
};

// The core's output and its gradients w.r.t. q, k, v for a fixed upstream gradient g.
CoreResult core_run(AttentionImpl impl, const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0,
                    const torch::Tensor& mask, bool causal, const torch::Tensor& g) {
  auto q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true),
       v = v0.detach().clone().requires_grad_(true);
  auto out = lt::models::attention_core(impl, q, k, v, mask, causal, /*dropout_p=*/0.0, /*train=*/true);
  out.backward(g.to(out.scalar_type()));
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

struct Case {
  const char* name;
  bool causal;
  bool padded;
};
const Case kCases[] = {{"causal", true, false},
                       {"causal, padded", true, true},
                       {"bidirectional", false, false},
                       {"bidirectional, padded", false, true}};

TEST(AttentionCore, SdpaMatchesPlainInFp32WithinOneInAHundredThousand) {
  torch::manual_seed(3);
  const int64_t b = 3, h = 4, t = 37, hd = 16;
  auto q = torch::randn({b, h, t, hd}), k = torch::randn({b, h, t, hd}), v = torch::randn({b, h, t, hd});
  auto g = torch::randn({b, h, t, hd});
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    const auto mask = c.padded ? right_padding(b, t) : torch::Tensor();
    const auto s = core_run(AttentionImpl::kSdpa, q, k, v, mask, c.causal, g);
    const auto p = core_run(AttentionImpl::kPlain, q, k, v, mask, c.causal, g);
    const double e_out = rel_err(s.out, p.out, p.out), e_q = rel_err(s.dq, p.dq, p.dq),
                 e_k = rel_err(s.dk, p.dk, p.dk), e_v = rel_err(s.dv, p.dv, p.dv);
    ::testing::Test::RecordProperty(std::string(c.name) + " fp32 out/dq/dk/dv",
                                    sci(e_out) + " " + sci(e_q) + " " + sci(e_k) + " " + sci(e_v));
    EXPECT_LE(e_out, 1e-5);
    EXPECT_LE(e_q, 1e-5);
    EXPECT_LE(e_k, 1e-5);
    EXPECT_LE(e_v, 1e-5);
  }
}

// bf16 inputs: each core is compared with the fp32 plain result on the same (bf16-rounded)
// inputs. Tolerance: 1e-2 of the largest magnitude (bf16 has 8 significant bits: 3.9e-3 per
// rounding, and the probabilities, their gradients and both products round; measured: at most
// 5.5e-3 for SDPA, 1.3e-2 for plain bf16, whose probabilities are bf16); and SDPA may not be
// more than twice as far from fp32 as plain bf16 is, plus 1e-3.
TEST(AttentionCore, SdpaMatchesPlainInBf16WithinTolerance) {
  torch::manual_seed(4);
  const int64_t b = 2, h = 4, t = 64, hd = 32;
  auto q = torch::randn({b, h, t, hd}).to(torch::kBFloat16), k = torch::randn({b, h, t, hd}).to(torch::kBFloat16),
       v = torch::randn({b, h, t, hd}).to(torch::kBFloat16);
  auto g = torch::randn({b, h, t, hd});
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    const auto mask = c.padded ? right_padding(b, t) : torch::Tensor();
    const auto ref = core_run(AttentionImpl::kPlain, q.to(torch::kFloat), k.to(torch::kFloat), v.to(torch::kFloat),
                              mask, c.causal, g);
    const auto s = core_run(AttentionImpl::kSdpa, q, k, v, mask, c.causal, g);
    const auto p = core_run(AttentionImpl::kPlain, q, k, v, mask, c.causal, g);
    ASSERT_EQ(s.out.scalar_type(), torch::kBFloat16);
    const std::vector<std::pair<const char*, std::array<torch::Tensor, 3>>> parts = {
        {"out", {s.out, p.out, ref.out}}, {"dq", {s.dq, p.dq, ref.dq}},
        {"dk", {s.dk, p.dk, ref.dk}},     {"dv", {s.dv, p.dv, ref.dv}}};
    for (const auto& [what, x] : parts) {
      const double e_sdpa = rel_err(x[0], x[2], x[2]), e_plain = rel_err(x[1], x[2], x[2]);
      ::testing::Test::RecordProperty(std::string(c.name) + " bf16 " + what + " sdpa/plain",
                                      sci(e_sdpa) + " " + sci(e_plain));
      EXPECT_LE(e_sdpa, 1e-2) << what;
      EXPECT_LE(e_sdpa, 2 * e_plain + 1e-3) << what << ": plain bf16 is at " << e_plain;
    }
  }
}

// The padding mask is honoured: keys at padded positions do not reach any output (changing
// them changes nothing), while changing a real key does.
TEST(AttentionCore, PaddedKeysDoNotReachTheOutput) {
  torch::manual_seed(5);
  const int64_t b = 3, h = 2, t = 12, hd = 8;
  auto q = torch::randn({b, h, t, hd}), k = torch::randn({b, h, t, hd}), v = torch::randn({b, h, t, hd});
  const auto mask = right_padding(b, t);
  const auto pad = mask.logical_not().view({b, 1, t, 1});
  auto k2 = torch::where(pad, k + 5, k), v2 = torch::where(pad, v * 3 - 1, v);
  for (auto impl : {AttentionImpl::kSdpa, AttentionImpl::kPlain})
    for (bool causal : {false, true}) {
      SCOPED_TRACE(std::string(lt::models::attention_name(impl)) + (causal ? " causal" : " bidirectional"));
      torch::NoGradGuard no_grad;
      const auto a = lt::models::attention_core(impl, q, k, v, mask, causal, 0.0, false);
      EXPECT_TRUE(torch::equal(a, lt::models::attention_core(impl, q, k2, v2, mask, causal, 0.0, false)));
      EXPECT_FALSE(torch::allclose(a, lt::models::attention_core(impl, q, k2, v2, torch::Tensor(), causal, 0.0, false)))
          << "without the mask the padded keys must matter (the check above could not fail otherwise)";
    }
}

// Note [SDPA's math fallback]: with attention dropout on the CPU no fused kernel exists, and
// "sdpa" runs the plain core (bitwise, the same dropout draws) instead of LibTorch's math
// fallback, which in bf16 keeps its [B,H,T,T] tensors in fp32.
TEST(AttentionCore, WithDropoutOnTheCpuSdpaRunsThePlainCore) {
  torch::manual_seed(9);
  const int64_t b = 2, h = 3, t = 24, hd = 8;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    auto q = torch::randn({b, h, t, hd}).to(dtype), k = torch::randn({b, h, t, hd}).to(dtype),
         v = torch::randn({b, h, t, hd}).to(dtype);
    EXPECT_FALSE(lt::models::sdpa_runs_fused(q, k, v, torch::Tensor(), true, 0.2));
    EXPECT_TRUE(lt::models::sdpa_runs_fused(q, k, v, torch::Tensor(), true, 0.0));
    torch::manual_seed(10);
    const auto s = lt::models::attention_core(AttentionImpl::kSdpa, q, k, v, torch::Tensor(), true, 0.2, true);
    torch::manual_seed(10);
    const auto p = lt::models::attention_core(AttentionImpl::kPlain, q, k, v, torch::Tensor(), true, 0.2, true);
    EXPECT_TRUE(torch::equal(s, p)) << dtype;
    torch::manual_seed(11);
    EXPECT_FALSE(torch::equal(s, lt::models::attention_core(AttentionImpl::kPlain, q, k, v, torch::Tensor(), true, 0.2, true)))
        << "another draw must differ (the check above could not fail otherwise)";
  }
}

// The whole module, same weights: output, input gradient and every parameter's gradient.
TEST(SelfAttention, SdpaModuleMatchesPlainModuleWithItsParameterGradients) {
  const int64_t b = 3, t = 29, d = 48, h = 4;
  for (const auto& c : kCases) {
    SCOPED_TRACE(c.name);
    torch::manual_seed(6);
    lt::models::SelfAttentionImpl sdpa(d, h, 0.0, c.causal, AttentionImpl::kSdpa);
    lt::models::SelfAttentionImpl plain(d, h, 0.0, c.causal, AttentionImpl::kPlain);
    {
      torch::NoGradGuard no_grad;
      for (auto& p : plain.named_parameters()) p.value().copy_(sdpa.named_parameters()[p.key()]);
    }
    const auto x0 = torch::randn({b, t, d});
    const auto mask = c.padded ? right_padding(b, t) : torch::Tensor();
    const auto g = torch::randn({b, t, d});
    auto x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
    auto y1 = sdpa.forward(x1, mask), y2 = plain.forward(x2, mask);
    y1.backward(g);
    y2.backward(g);
    EXPECT_LE(rel_err(y1, y2, y2), 1e-5);
    EXPECT_LE(rel_err(x1.grad(), x2.grad(), x2.grad()), 1e-5);
    for (auto& p : plain.named_parameters()) {
      const auto gs = sdpa.named_parameters()[p.key()].grad(), gp = p.value().grad();
      ASSERT_TRUE(gs.defined() && gp.defined()) << p.key();
      EXPECT_LE(rel_err(gs, gp, gp), 1e-5) << p.key();
    }
  }
}

lt::models::ModelConfig tiny(const std::string& kind, const std::string& attention) {
  lt::models::ModelConfig c;
  c.kind = kind;
  c.vocab_size = 96;
  c.seq_len = 48;
  c.n_layer = 3;
  c.n_head = 4;
  c.d_model = 64;
  c.dropout = 0.0;
  c.attention = attention;
  return c;
}

// Sets CPU autocast to bf16 for a scope (fp32: nothing), restoring what was there.
struct Bf16Autocast {
  const bool on, before;
  const at::ScalarType dtype_before;
  explicit Bf16Autocast(bool enable)
      : on(enable), before(at::autocast::is_autocast_enabled(at::kCPU)),
        dtype_before(at::autocast::get_autocast_dtype(at::kCPU)) {
    if (!on) return;
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~Bf16Autocast() {
    if (!on) return;
    at::autocast::set_autocast_enabled(at::kCPU, before);
    at::autocast::set_autocast_dtype(at::kCPU, dtype_before);
    at::autocast::clear_cache();
  }
};

// The training loss of one batch and the gradient of the token embedding, built with the seed
// that gives both options the same weights.
std::pair<double, torch::Tensor> model_loss(const lt::models::ModelConfig& c, bool bf16) {
  torch::manual_seed(11);
  auto model = lt::models::build_model(c);
  model->train();
  torch::manual_seed(12);
  auto x = torch::randint(0, c.vocab_size, {4, c.seq_len});
  auto y = torch::randint(0, c.vocab_size, {4, c.seq_len});
  if (c.kind == "bert") y = torch::where(torch::rand({4, c.seq_len}) < 0.15, y, torch::full_like(y, -100));
  torch::Tensor loss;
  {
    Bf16Autocast ac(bf16);
    loss = model->forward_loss(x, y);
  }
  loss.backward();
  return {loss.item<double>(), model->named_parameters()[c.kind == "gpt" ? "wte.weight" : "tok_emb.weight"].grad()};
}

TEST(AttentionModels, GptAndBertLossesAgreeAcrossAttentionOptions) {
  for (const char* kind : {"gpt", "bert"})
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(kind) + (bf16 ? " bf16" : " fp32"));
      const auto [ls, gs] = model_loss(tiny(kind, "sdpa"), bf16);
      const auto [lp, gp] = model_loss(tiny(kind, "plain"), bf16);
      ::testing::Test::RecordProperty(std::string(kind) + (bf16 ? "_bf16" : "_fp32") + "_loss_rel",
                                      sci(std::abs(ls - lp) / std::abs(lp)));
      // fp32: the same function up to summation order; bf16: both round differently (the
      // plain core rounds its scores and probabilities to bf16, the fused one keeps fp32).
      EXPECT_LE(std::abs(ls - lp), (bf16 ? 1e-2 : 1e-5) * std::abs(lp)) << ls << " vs " << lp;
      EXPECT_LE(rel_err(gs, gp, gp), bf16 ? 5e-2 : 1e-4);
    }
}

// The model option is bound, defaults to sdpa, and the kernel LibTorch picks is named: flash
// attention on the CPU without dropout, its math fallback with attention dropout.
TEST(AttentionModels, ComputeNoteNamesTheKernel) {
  EXPECT_EQ(lt::models::ModelConfig{}.attention, "sdpa");
  for (const char* kind : {"gpt", "bert"}) {
    SCOPED_TRACE(kind);
    auto c = tiny(kind, "sdpa");
    const auto flash = lt::models::build_model(c)->compute_note(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(flash.rfind("attention sdpa: flash attention", 0), 0u) << flash;
    c.dropout = 0.1;
    const auto math = lt::models::build_model(c)->compute_note(torch::kCPU, torch::kFloat);
    EXPECT_EQ(math.rfind("attention sdpa: math", 0), 0u) << math;
    EXPECT_NE(math.find("the plain core runs instead"), std::string::npos) << math;
    c.attention = "plain";
    EXPECT_EQ(lt::models::build_model(c)->compute_note(torch::kCPU, torch::kFloat).rfind("attention plain", 0), 0u);
  }
  lt::models::ModelConfig mlp;
  EXPECT_EQ(lt::models::build_model(mlp)->compute_note(torch::kCPU, torch::kFloat), "");
  auto bad = tiny("gpt", "flash");
  EXPECT_THROW(lt::models::build_model(bad), lt::ConfigError);
}

// Peak bytes above the start of one forward_loss + backward (the tracking allocator).
int64_t activation_peak(const lt::models::ModelConfig& c, const std::string& policy) {
  torch::manual_seed(1);
  auto model = lt::models::build_model(c);
  model->train();
  lt::models::apply_recompute_policy(*model, lt::models::RecomputePolicy::parse(policy));
  auto x = torch::randint(0, c.vocab_size, {4, c.seq_len}), y = torch::randint(0, c.vocab_size, {4, c.seq_len});
  lt::MemoryMeter meter(-1);
  meter.reset_peak();
  const int64_t base = meter.stats().current_bytes;
  model->forward_loss(x, y).backward();
  return meter.stats().peak_bytes - base;
}

// At a sequence where the probabilities dominate, SDPA's activation peak is well below plain's;
// under SDPA's fused kernel `selective` recomputes nothing (its peak is none's), while under
// plain it drops the probabilities (Note [Selective recompute under SDPA]); `full` is below
// both.
TEST(AttentionMemory, SdpaDropsTheProbabilitiesAndSelectiveKeepsNoneOfItsOwn) {
  auto c = tiny("gpt", "sdpa");
  c.seq_len = 256;
  c.n_layer = 4;
  const auto sdpa_none = activation_peak(c, "none"), sdpa_sel = activation_peak(c, "selective"),
             sdpa_full = activation_peak(c, "full");
  c.attention = "plain";
  const auto plain_none = activation_peak(c, "none"), plain_sel = activation_peak(c, "selective");
  for (auto [k, v] : {std::pair{"sdpa_none", sdpa_none}, {"sdpa_selective", sdpa_sel}, {"sdpa_full", sdpa_full},
                      {"plain_none", plain_none}, {"plain_selective", plain_sel}})
    ::testing::Test::RecordProperty(k, std::to_string(v));
  EXPECT_LT(sdpa_none, 0.6 * plain_none) << sdpa_none << " vs " << plain_none;
  EXPECT_EQ(sdpa_sel, sdpa_none);
  EXPECT_LT(plain_sel, 0.8 * plain_none);
  EXPECT_LT(sdpa_full, 0.8 * sdpa_none);
}

// What `selective` would save by recomputing a fused SDPA core (Note [Selective recompute under
// SDPA]): the bytes kept from forward to backward by qkv -> core -> proj, with the core run
// directly and through recompute::in_backward. The recompute keeps q, k, v as its inputs and
// the output is proj's saved input either way, so only the [B,H,T] fp32 logsumexp goes (less
// the RNG state the recompute keeps); with the plain core the [B,H,T,T] probabilities go too.
int64_t kept_after_forward(AttentionImpl impl, bool recompute, int64_t b, int64_t t, int64_t d, int64_t h) {
  torch::manual_seed(8);
  torch::nn::Linear qkv(d, 3 * d), proj(d, d);
  auto x = torch::randn({b, t, d}).requires_grad_(true);
  lt::MemoryMeter meter(-1);
  const int64_t base = meter.stats().current_bytes;
  auto parts = qkv(x).split(d, -1);
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, h, d / h}).transpose(1, 2); };
  auto core = [impl](const std::vector<torch::Tensor>& in) {
    return lt::models::attention_core(impl, in[0], in[1], in[2], torch::Tensor(), true, 0.0, true);
  };
  std::vector<torch::Tensor> in{heads(parts[0]), heads(parts[1]), heads(parts[2])};
  parts.clear();
  auto y = recompute ? lt::recompute::in_backward(core, in, {}) : core(in);
  in.clear();
  auto out = proj(y.transpose(1, 2).reshape({b, t, d}));
  y = torch::Tensor();
  const int64_t kept = meter.stats().current_bytes - base - out.numel() * 4;
  out.sum().backward();  // the graph was complete
  return kept;
}

TEST(AttentionMemory, RecomputingAFusedCoreWouldDropOnlyItsLogsumexp) {
  const int64_t b = 4, t = 256, d = 64, h = 4;
  const int64_t lse = b * h * t * 4, probs = b * h * t * t * 4;
  const int64_t sdpa_saved = kept_after_forward(AttentionImpl::kSdpa, false, b, t, d, h) -
                             kept_after_forward(AttentionImpl::kSdpa, true, b, t, d, h);
  const int64_t plain_saved = kept_after_forward(AttentionImpl::kPlain, false, b, t, d, h) -
                              kept_after_forward(AttentionImpl::kPlain, true, b, t, d, h);
  ::testing::Test::RecordProperty("sdpa_saved", std::to_string(sdpa_saved));
  ::testing::Test::RecordProperty("plain_saved", std::to_string(plain_saved));
  // The recompute keeps the CPU generator's state (5,056 bytes) to replay the RNG: the net
  // saving is the logsumexp less that.
  EXPECT_LE(sdpa_saved, lse) << "logsumexp " << lse << " bytes";
  EXPECT_GE(sdpa_saved, lse - 8192) << "logsumexp " << lse << " bytes";
  EXPECT_GE(plain_saved, probs) << "probabilities " << probs << " bytes";
}

}  // namespace
