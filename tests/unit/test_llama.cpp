// The llama kind (models/include/leantrain/models/llama.h): parameter names and shapes for
// Llama-, Qwen2-, Qwen3- and Mistral-like option sets; grouped-query attention against the same
// model with k/v repeated (plain multi-head); llama3 RoPE scaling against the formula;
// recompute none / full / every:2 / selective bitwise over a few steps; the fused head + loss
// against the plain cross-entropy (tied and untied); the SwiGLU MLP and RMSNorm keeping only
// what they say (tracking allocator); the activation bytes per policy; bad options.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "autograd_nodes.h"
#include "expect_error.h"
#include "leantrain/models/llama.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/precision.h"

namespace {

using lt::models::Llama;
using lt::models::LlamaConfig;

// Small option sets shaped as each family's config.json.
LlamaConfig tiny(const std::string& family) {
  LlamaConfig c;
  c.family = family;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.seq_len = 16;
  c.max_position_embeddings = 64;
  if (family == "llama") {  // Llama 3.2: llama3 RoPE scaling, tied head
    c.rope_theta = 500000;
    c.rope_scaling = "llama3";
    c.rope_original_max_position_embeddings = 32;
    c.tie_word_embeddings = true;
  } else if (family == "qwen2") {  // q/k/v biases, untied
    c.rope_theta = 1000000;
    c.attention_bias = true;
    c.rms_norm_eps = 1e-6;
  } else if (family == "qwen3") {  // q/k norms, head_dim * heads != hidden_size, tied
    c.qk_norm = true;
    c.head_dim = 32;
    c.tie_word_embeddings = true;
  } else if (family == "mistral") {  // one key/value head for four query heads
    c.num_key_value_heads = 1;
  }
  return c;
}

lt::ModelSection section(const LlamaConfig& c) { return {"llama", lt::models::llama_options().write(c)}; }

std::shared_ptr<Llama> build(const LlamaConfig& c, uint64_t seed = 1) {
  torch::manual_seed(seed);
  auto m = std::dynamic_pointer_cast<Llama>(lt::models::build_model(section(c)));
  EXPECT_TRUE(m) << "build_model(kind llama) is not a Llama";
  return m;
}

// Biases and norm weights off their init (0 and 1), as a trained model has them.
void perturb_vectors(torch::nn::Module& m) {
  torch::NoGradGuard no_grad;
  for (auto& p : m.parameters())
    if (p.dim() == 1) p.add_(torch::randn_like(p), 0.1);
}

std::pair<torch::Tensor, torch::Tensor> batch(const LlamaConfig& c, int64_t b = 3, int64_t t = -1) {
  torch::manual_seed(7);
  const int64_t len = t > 0 ? t : c.seq_len;
  auto y = torch::randint(0, c.vocab_size, {b, len});
  y.index_put_({0, 1}, lt::models::kIgnoreIndex);
  return {torch::randint(0, c.vocab_size, {b, len}), y};
}

TEST(Llama, ParameterNamesAndShapesPerFamily) {
  for (const char* family : {"llama", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(family);
    const auto c = tiny(family);
    auto m = build(c);
    const int64_t d = c.hidden_size, f = c.intermediate_size, v = c.vocab_size, h = c.head_size();
    const int64_t qd = c.num_attention_heads * h, kd = c.kv_heads() * h;
    std::vector<std::pair<std::string, std::vector<int64_t>>> want{{"embed_tokens.weight", {v, d}}};
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
      const std::string b = "blocks." + std::to_string(i) + ".";
      want.push_back({b + "input_layernorm.weight", {d}});
      for (const auto& [proj, rows] : std::vector<std::pair<std::string, int64_t>>{{"q", qd}, {"k", kd}, {"v", kd}}) {
        want.push_back({b + "self_attn." + proj + "_proj.weight", {rows, d}});
        if (c.attention_bias) want.push_back({b + "self_attn." + proj + "_proj.bias", {rows}});
      }
      want.push_back({b + "self_attn.o_proj.weight", {d, qd}});
      if (c.qk_norm) {
        want.push_back({b + "self_attn.q_norm.weight", {h}});
        want.push_back({b + "self_attn.k_norm.weight", {h}});
      }
      want.push_back({b + "post_attention_layernorm.weight", {d}});
      want.push_back({b + "mlp.gate_proj.weight", {f, d}});
      want.push_back({b + "mlp.up_proj.weight", {f, d}});
      want.push_back({b + "mlp.down_proj.weight", {d, f}});
    }
    want.push_back({"norm.weight", {d}});
    if (!c.tie_word_embeddings) want.push_back({"lm_head.weight", {v, d}});
    const auto named = m->named_parameters();
    ASSERT_EQ(named.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(named[i].key(), want[i].first);
      EXPECT_EQ(named[i].value().sizes().vec(), want[i].second) << want[i].first;
    }
    EXPECT_EQ(m->named_buffers().size(), 0u);
    const auto& head = c.tie_word_embeddings ? m->embed_tokens->weight : m->lm_head->weight;
    EXPECT_EQ(m->head_weight().data_ptr(), head.data_ptr());
    // Init: normal(0, 0.02) matrices, norms 1, biases 0.
    for (const auto& p : named) {
      const auto& t = p.value();
      if (p.key().find("norm") != std::string::npos) EXPECT_TRUE(torch::all(t == 1).item<bool>()) << p.key();
      if (p.key().find(".bias") != std::string::npos) EXPECT_TRUE(torch::all(t == 0).item<bool>()) << p.key();
      if (t.dim() == 2) EXPECT_NEAR(t.std().item<double>(), 0.02, 0.004) << p.key();
    }
    auto [x, y] = batch(c, 2, 11);
    const auto logits = m->forward(x);
    EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{2, 11, v}));
    EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
  }
}

TEST(Llama, RegisteredWithItsContractAndOptions) {
  const auto names = lt::models::model_kind_names();
  EXPECT_NE(std::find(names.begin(), names.end(), "llama"), names.end());
  const auto contract = lt::models::model_contract(section(tiny("llama")));
  EXPECT_EQ(contract.input, lt::InputContract::Input::kTokens);
  EXPECT_EQ(contract.target, lt::InputContract::Target::kNextToken);
  EXPECT_EQ(contract.seq_len, 16);
  EXPECT_EQ(contract.vocab_size, 96);
  // Every key of the table is an LlamaConfig member that round-trips.
  const auto c = tiny("qwen3");
  const auto back = lt::models::llama_options().read(lt::models::llama_options().write(c));
  EXPECT_EQ(lt::models::llama_options().write(back), lt::models::llama_options().write(c));
  EXPECT_EQ(lt::models::llama_options().table().size(), 23u);
  // The defaults build.
  EXPECT_NO_THROW(lt::models::build_model(lt::ModelSection{"llama", {}}));
}

// Each key/value head shared by H/K query heads equals the multi-head model whose k_proj and
// v_proj rows are those heads repeated (Hugging Face's repeat_kv): the same logits, and the
// GQA gradients of k_proj / v_proj are the multi-head ones summed over each group.
TEST(Llama, GroupedQueryAttentionEqualsRepeatedKeyValueHeads) {
  for (const char* attention : {"sdpa", "plain"})
    for (const char* family : {"qwen2", "mistral"}) {
      SCOPED_TRACE(std::string(attention) + " " + family);
      auto c = tiny(family);
      c.attention = attention;
      auto mha_cfg = c;
      mha_cfg.num_key_value_heads = c.num_attention_heads;
      auto gqa = build(c), mha = build(mha_cfg);
      perturb_vectors(*gqa);
      const int64_t rep = c.num_attention_heads / c.kv_heads(), h = c.head_size();
      {
        torch::NoGradGuard no_grad;
        auto src = gqa->named_parameters();
        for (auto& p : mha->named_parameters()) {
          auto s = src[p.key()];
          const bool kv = p.key().find("k_proj") != std::string::npos || p.key().find("v_proj") != std::string::npos;
          if (kv) {
            auto heads = s.view({c.kv_heads(), h, -1}).repeat_interleave(rep, 0);
            p.value().copy_(heads.reshape(p.value().sizes()));
          } else {
            p.value().copy_(s);
          }
        }
      }
      auto [x, y] = batch(c);
      gqa->train();
      mha->train();
      const auto lg = gqa->forward(x), lm = mha->forward(x);
      EXPECT_TRUE(torch::allclose(lg, lm, 1e-5, 1e-5)) << (lg - lm).abs().max().item<double>();
      lt::models::compute_loss(gqa->task(), lg, y).backward();
      lt::models::compute_loss(mha->task(), lm, y).backward();
      auto mg = mha->named_parameters();
      for (auto& p : gqa->named_parameters()) {
        auto want = mg[p.key()].grad();
        const bool kv = p.key().find("k_proj") != std::string::npos || p.key().find("v_proj") != std::string::npos;
        if (kv) want = want.view({c.kv_heads(), rep, h, -1}).sum(1).reshape(p.value().sizes());
        EXPECT_TRUE(torch::allclose(p.value().grad(), want, 1e-4, 1e-6))
            << p.key() << " " << (p.value().grad() - want).abs().max().item<double>();
      }
    }
}

// llama3 RoPE scaling: inv_freq against Meta's formula computed in double.
TEST(Llama, Llama3RopeScalingOfInvFreqFollowsTheFormula) {
  LlamaConfig c;
  c.hidden_size = 2048;
  c.num_attention_heads = 32;  // head_dim 64, Llama 3.2 1B's
  c.rope_theta = 500000;
  c.rope_scaling = "llama3";
  const auto got = lt::models::rope_inv_freq(c);
  ASSERT_EQ(got.sizes().vec(), std::vector<int64_t>{32});
  EXPECT_EQ(got.scalar_type(), torch::kFloat);
  const double factor = 8, low = 1, high = 4, old = 8192, low_wl = old / low, high_wl = old / high;
  int regions[3] = {0, 0, 0};
  for (int64_t j = 0; j < 32; ++j) {
    const double inv = 1.0 / std::pow(500000.0, 2.0 * j / 64.0), wl = 2 * M_PI / inv;
    double want;
    if (wl < high_wl) {
      want = inv, ++regions[0];
    } else if (wl > low_wl) {
      want = inv / factor, ++regions[1];
    } else {
      const double s = (old / wl - low) / (high - low);
      want = (1 - s) * inv / factor + s * inv, ++regions[2];
    }
    EXPECT_NEAR(got[j].item<double>(), want, 2e-6 * want) << "j = " << j;
  }
  // Every branch of the formula is exercised (high, low and medium frequencies).
  EXPECT_GT(regions[0], 0);
  EXPECT_GT(regions[1], 0);
  EXPECT_GT(regions[2], 0);
  c.rope_scaling = "none";
  const auto plain = lt::models::rope_inv_freq(c);
  for (int64_t j = 0; j < 32; ++j)
    EXPECT_NEAR(plain[j].item<double>(), 1.0 / std::pow(500000.0, 2.0 * j / 64.0), 1e-6 * plain[j].item<double>());
}

// The RoPE tables: cos/sin(t * inv_freq) over both halves (Hugging Face's cat(freqs, freqs)),
// position 0 unrotated; causal attention: a token's logits do not depend on later tokens.
TEST(Llama, RopeTablesAndCausalAttention) {
  auto c = tiny("llama");
  lt::models::RopeTables tables(c);
  const auto inv = lt::models::rope_inv_freq(c);
  const int64_t half = c.head_size() / 2;
  const auto [cos, sin] = tables.get(5, torch::kCPU, torch::kFloat);
  ASSERT_EQ(cos.sizes().vec(), (std::vector<int64_t>{5, c.head_size()}));
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t j = 0; j < c.head_size(); ++j) {
      const double angle = static_cast<double>(t) * inv[j % half].item<float>();
      EXPECT_NEAR(cos[t][j].item<double>(), std::cos(angle), 1e-6);
      EXPECT_NEAR(sin[t][j].item<double>(), std::sin(angle), 1e-6);
    }
  EXPECT_EQ(tables.get(5, torch::kCPU, torch::kBFloat16).first.scalar_type(), torch::kBFloat16);
  auto m = build(c);
  m->eval();
  torch::NoGradGuard no_grad;
  auto x = torch::randint(0, c.vocab_size, {1, 8});
  auto x2 = x.clone();
  x2.index_put_({0, 6}, (x[0][6].item<int64_t>() + 1) % c.vocab_size);
  const auto a = m->forward(x), b = m->forward(x2);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 6), b.narrow(1, 0, 6), 1e-6, 1e-7));
  EXPECT_FALSE(torch::equal(a.narrow(1, 6, 2), b.narrow(1, 6, 2)));
}

struct Steps {
  std::vector<double> losses;
  std::vector<std::map<std::string, torch::Tensor>> grads;
  int swiglu = 0;  // SwiGluDown nodes in the first forward's graph
};

// `steps` SGD steps of forward_loss (the fused head + loss) under `policy`.
Steps train(const LlamaConfig& c, const std::string& policy, const std::string& precision = "fp32", int steps = 10) {
  auto m = build(c);
  perturb_vectors(*m);
  m->train();
  lt::models::apply_recompute_policy(*m, lt::models::RecomputePolicy::parse(policy));
  Steps s;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(100 + step);
    auto x = torch::randint(0, c.vocab_size, {3, c.seq_len}), y = torch::randint(0, c.vocab_size, {3, c.seq_len});
    torch::manual_seed(200 + step);  // the dropout masks
    torch::Tensor loss;
    {
      lt::trainers::AutocastGuard ac(precision, torch::kCPU);
      loss = m->forward_loss(x, y);
    }
    if (step == 0) s.swiglu = lt_test::count_nodes(loss, "SwiGluDown");
    loss.backward();
    s.losses.push_back(loss.item<double>());
    std::map<std::string, torch::Tensor> g;
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters()) {
      EXPECT_TRUE(p.value().grad().defined()) << p.key() << " under " << policy;
      g[p.key()] = p.value().grad().clone();
      p.value().sub_(p.value().grad(), 0.5);
      p.value().mutable_grad() = torch::Tensor();
    }
    s.grads.push_back(std::move(g));
  }
  return s;
}

void expect_bitwise(const Steps& a, const Steps& b) {
  ASSERT_EQ(a.losses.size(), b.losses.size());
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i;
    for (const auto& [name, g] : a.grads[i])
      EXPECT_TRUE(torch::equal(g, b.grads[i].at(name))) << name << ", step " << i;
  }
}

// Every policy computes the same losses and gradients bitwise over 10 SGD steps: with the fused kernel (dropout 0)
// and with dropout (the plain core, which selective recomputes), in fp32 (and bf16 for the
// tied Llama and Qwen3), for a tied Llama with llama3 RoPE, Qwen2 with biases, Qwen3 with q/k
// norms and Mistral's one k/v head.
class LlamaRecompute : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaRecompute, PoliciesBitwiseEqualOverSteps) {
  const std::string family = GetParam();
  for (const double dropout : {0.0, 0.1})
    for (const char* precision : {"fp32", "bf16"}) {
      if (std::string(precision) == "bf16" && family != "llama" && family != "qwen3") continue;
      auto c = tiny(family);
      c.dropout = dropout;
      const auto none = train(c, "none", precision);
      EXPECT_EQ(none.swiglu, c.num_hidden_layers);
      for (const char* policy : {"full", "every:2", "selective"}) {
        SCOPED_TRACE(family + ", dropout " + std::to_string(dropout) + ", " + precision + ", " + policy);
        const auto rc = train(c, policy, precision);
        expect_bitwise(none, rc);
        // Under full only the last block (not recomputed) records its MLP in the forward's graph.
        if (std::string(policy) == "full") EXPECT_EQ(rc.swiglu, 1);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Families, LlamaRecompute, ::testing::Values("llama", "qwen2", "qwen3", "mistral"),
                         [](const auto& info) { return info.param; });

// The fused chunked head + loss against cross-entropy over the full logits: the same loss and
// gradients (to rounding), tied and untied, with an ignored target; under fp16, where the fused
// loss does not run, the head + loss in recomputed chunks (no [B,T,V] logits either).
TEST(Llama, FusedLossEqualsPlainCrossEntropy) {
  for (const char* family : {"llama", "qwen2"}) {
    SCOPED_TRACE(family);
    const auto c = tiny(family);
    auto [x, y] = batch(c);
    auto run = [&, &x = x, &y = y](const std::string& how, const std::string& precision = "fp32") {
      auto m = build(c);
      perturb_vectors(*m);
      m->train();
      if (how == "chunk 7") m->set_loss_chunk_tokens(7);
      torch::Tensor loss;
      {
        lt::trainers::AutocastGuard ac(precision, torch::kCPU);
        loss = how == "plain" ? lt::models::compute_loss(m->task(), m->forward(x).to(torch::kFloat), y)
                              : m->forward_loss(x, y);
      }
      const bool fused = how != "plain" && precision != "fp16";
      EXPECT_EQ(lt_test::count_nodes(loss, "FusedLinearCrossEntropy"), fused ? 1 : 0) << how << " " << precision;
      EXPECT_EQ(lt_test::count_nodes(loss, "TiedEmbedding"), fused && c.tie_word_embeddings ? 1 : 0);
      EXPECT_EQ(lt_test::count_nodes(loss, "RecomputeFunction") > 0, how != "plain" && precision == "fp16");
      loss.backward();
      std::map<std::string, torch::Tensor> g;
      for (auto& p : m->named_parameters()) g[p.key()] = p.value().grad();
      return std::make_pair(loss.item<double>(), g);
    };
    const auto plain = run("plain");
    for (const auto& other : {run("fused"), run("chunk 7")}) {
      EXPECT_NEAR(other.first, plain.first, 1e-6 * plain.first);
      for (const auto& [name, g] : plain.second)
        EXPECT_TRUE(torch::allclose(other.second.at(name), g, 1e-4, 1e-7))
            << name << " " << (other.second.at(name) - g).abs().max().item<double>();
    }
    const auto fp16_plain = run("plain", "fp16"), fp16 = run("fused", "fp16");
    EXPECT_NEAR(fp16.first, fp16_plain.first, 1e-3 * fp16_plain.first);
  }
}

// Bytes kept from a forward to its backward (the tracking allocator), output excluded.
template <class F>
int64_t kept_bytes(F&& forward, const std::string& precision = "fp32") {
  lt::MemoryMeter meter(-1);
  const int64_t base = meter.stats().current_bytes;
  torch::Tensor out;
  {
    lt::trainers::AutocastGuard ac(precision, torch::kCPU);
    out = forward();
  }
  const int64_t bytes = meter.stats().current_bytes - base - static_cast<int64_t>(out.nbytes());
  out.sum().backward();
  return bytes;
}

// Note [SwiGLU recomputed in the MLP's backward]: the MLP keeps its gate and up outputs only, not
// silu(gate) nor the [N,F] product, which the plain expression keeps; RMSNorm keeps only its
// [N,1] rsqrt beside its input (Note [RMSNorm keeps its input and rsqrt]).
TEST(Llama, SwigluIntermediateAndNormalisedInputNotKept) {
  const int64_t n = 256, d = 64, f = 192;
  torch::manual_seed(3);
  auto mlp = std::make_shared<lt::models::LlamaMLPImpl>(d, f);
  auto x = torch::randn({n / 8, 8, d}).requires_grad_(true);
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const int64_t e = std::string(precision) == "fp32" ? 4 : 2;
    const auto now = kept_bytes([&] { return mlp->forward(x); }, precision);
    const auto plain = kept_bytes(
        [&] { return mlp->down_proj(torch::silu(mlp->gate_proj(x)) * mlp->up_proj(x)); }, precision);
    ::testing::Test::RecordProperty(std::string("mlp_kept_") + precision, std::to_string(now));
    ::testing::Test::RecordProperty(std::string("mlp_plain_kept_") + precision, std::to_string(plain));
    // gate and up outputs; under autocast also the one bf16 copy of x both projections share
    // and their bf16 weights, which their products keep for x's gradient (as any Linear's).
    EXPECT_EQ(now, 2 * n * f * e + (e == 2 ? n * d * 2 + 2 * f * d * 2 : 0));
    EXPECT_GE(plain - now, 2 * n * f * e);
  }
  auto norm = std::make_shared<lt::models::RMSNormImpl>(d, 1e-5);
  EXPECT_EQ(kept_bytes([&] { return norm->forward(x); }), n * 4);
}

// A whole block keeps, to the byte (fused SDPA, no dropout): the input norm's rsqrt and output
// (one copy under autocast, shared by q_proj, k_proj and v_proj), the RoPE'd q and k, v, SDPA's
// output and logsumexp, the residual h, the second norm's rsqrt and output, the gate and up
// outputs; under bf16 also the low-precision weight copies the projections keep for their
// inputs' gradients. Not the normalised inputs, silu(gate), the product, nor an fp32 q or k.
TEST(Llama, BlockKeepsWhatItsLayersSay) {
  const LlamaConfig c = tiny("qwen2");  // biases: they add nothing kept
  auto rope = std::make_shared<lt::models::RopeTables>(c);
  auto block = std::make_shared<lt::models::LlamaBlockImpl>(c, rope);
  block->train();
  const int64_t b = 4, t = 16, n = b * t, d = c.hidden_size, f = c.intermediate_size;
  const int64_t qd = c.num_attention_heads * c.head_size(), kd = c.kv_heads() * c.head_size();
  auto x = torch::randn({b, t, d}).requires_grad_(true);
  (void)rope->get(t, torch::kCPU, torch::kFloat);  // the tables, allocated once
  const int64_t rows = 2 * n * 4 + b * c.num_attention_heads * t * 4;  // two rsqrt, the logsumexp
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    const int64_t e = std::string(precision) == "fp32" ? 4 : 2;
    const int64_t weights = e == 2 ? (2 * qd * d + 2 * kd * d + 2 * f * d) * 2 : 0;  // q, o, k, v, gate, up
    const int64_t acts = n * ((2 * d + 2 * qd + 2 * kd + 2 * f) * e + d * 4);     // h stays fp32
    EXPECT_EQ(kept_bytes([&] { return block->forward(x); }, precision), acts + rows + weights);
  }
}

// Activation bytes per sample of a training step (forward + backward peak above the start) under
// each policy, for the shape of configs/llama_tiny.toml: recorded in the test's XML, and falling
// from none to full; selective keeps what none keeps under the fused kernel and less with the
// plain core (dropout on the CPU).
int64_t activation_peak(const LlamaConfig& c, const std::string& policy, int64_t b) {
  auto m = build(c);
  m->train();
  lt::models::apply_recompute_policy(*m, lt::models::RecomputePolicy::parse(policy));
  auto x = torch::randint(0, c.vocab_size, {b, c.seq_len}), y = torch::randint(0, c.vocab_size, {b, c.seq_len});
  m->forward_loss(x, y).backward();  // warm: RoPE tables and allocator state
  for (auto& p : m->parameters()) p.mutable_grad() = torch::Tensor();
  lt::MemoryMeter meter(-1);
  meter.reset_peak();
  const int64_t base = meter.stats().current_bytes;
  m->forward_loss(x, y).backward();
  return (meter.stats().peak_bytes - base) / b;
}

TEST(Llama, ActivationBytesPerSampleFallWithRecompute) {
  LlamaConfig c;  // configs/llama_tiny.toml's model
  c.vocab_size = 256;
  c.hidden_size = 128;
  c.intermediate_size = 344;
  c.num_hidden_layers = 4;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.seq_len = 128;
  c.max_position_embeddings = 512;
  c.tie_word_embeddings = true;
  for (const double dropout : {0.0, 0.1}) {
    c.dropout = dropout;
    std::map<std::string, int64_t> per;
    for (const char* policy : {"none", "selective", "full"}) {
      per[policy] = activation_peak(c, policy, 8);
      ::testing::Test::RecordProperty(std::string("dropout") + (dropout > 0 ? "0.1_" : "0_") + policy,
                                      std::to_string(per[policy]));
    }
    EXPECT_LT(per["full"], 0.6 * per["none"]) << per["none"] << " " << per["full"];
    if (dropout > 0)
      EXPECT_LT(per["selective"], 0.9 * per["none"]) << per["none"] << " " << per["selective"];
    else
      EXPECT_LE(per["selective"], per["none"] + 64 * 1024) << per["none"] << " " << per["selective"];
  }
}

TEST(Llama, ComputeNoteAndAttentionTermNameTheKernel) {
  auto c = tiny("mistral");
  auto m = build(c);
  const auto note = m->compute_note(torch::kCPU, torch::kFloat);
  EXPECT_CONTAINS(note, "sdpa: flash attention");
  EXPECT_CONTAINS(note, "4 query / 1 key-value heads through enable_gqa");
  const auto none = lt::models::RecomputePolicy::parse("none");
  auto t = lt::models::llama_attention_memory(c, torch::kCPU, torch::kFloat, none);
  EXPECT_TRUE(t.fused);
  EXPECT_EQ(t.bytes_per_sample, 0);
  c.dropout = 0.1;  // no fused kernel takes dropout on the CPU: the plain core, k/v repeated
  EXPECT_CONTAINS(build(c)->compute_note(torch::kCPU, torch::kFloat), "k/v repeated to 4 heads");
  t = lt::models::llama_attention_memory(c, torch::kCPU, torch::kFloat, none);
  EXPECT_FALSE(t.fused);
  EXPECT_EQ(t.core, "sdpa: math, so the plain core");
  // softmax output, dropout noise and dropped probabilities, fp32, every layer.
  EXPECT_EQ(t.bytes_per_sample, c.num_hidden_layers * c.num_attention_heads * c.seq_len * c.seq_len * 3 * 4);
  const auto through_registry = lt::models::attention_memory(section(c), torch::kCPU, torch::kFloat,
                                                              lt::models::RecomputePolicy::parse("none"));
  EXPECT_EQ(through_registry.bytes_per_sample, t.bytes_per_sample);
}

TEST(Llama, Bf16AndFp16ForwardsTrain) {
  const auto c = tiny("qwen3");
  for (const char* precision : {"bf16", "fp16"}) {
    SCOPED_TRACE(precision);
    auto m = build(c);
    m->train();
    auto [x, y] = batch(c);
    torch::Tensor loss;
    {
      lt::trainers::AutocastGuard ac(precision, torch::kCPU);
      loss = m->forward_loss(x, y);
    }
    loss.backward();
    EXPECT_TRUE(std::isfinite(loss.item<double>()));
    EXPECT_NEAR(loss.item<double>(), std::log(96.0), 0.3);
    for (auto& p : m->named_parameters()) EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << p.key();
  }
}

TEST(Llama, BadOptionsAreConfigErrorsNamingTheKey) {
  auto resolve = [](std::vector<std::pair<std::string, lt::OptionValue>> given) {
    lt::Options o;
    for (auto& [k, v] : given) o.set(k, v);
    return [o] { lt::models::resolve_model(lt::ModelSection{"llama", o}); };
  };
  using V = lt::OptionValue;
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, V>>>> cases{
      {"model.num_key_value_heads = 3",
       {{"num_attention_heads", V(int64_t{4})}, {"num_key_value_heads", V(int64_t{3})}}},
      {"model.num_attention_heads = 3", {{"num_attention_heads", V(int64_t{3})}, {"hidden_size", V(int64_t{64})}}},
      {"model.head_dim = 7", {{"head_dim", V(int64_t{7})}}},
      {"model.seq_len = 4096", {{"seq_len", V(int64_t{4096})}, {"max_position_embeddings", V(int64_t{2048})}}},
      {"model.rope_scaling = \"yarn\"", {{"rope_scaling", V(std::string("yarn"))}}},
      {"model.rope_high_freq_factor = 1.0",
       {{"rope_scaling", V(std::string("llama3"))}, {"rope_high_freq_factor", V(1.0)}}},
      {"model.hidden_act = \"gelu\"", {{"hidden_act", V(std::string("gelu"))}}},
      {"model.family = \"gemma\"", {{"family", V(std::string("gemma"))}}},
      {"model.rms_norm_eps = 0.0", {{"rms_norm_eps", V(0.0)}}},
      {"model.rope_theta = -1.0", {{"rope_theta", V(-1.0)}}},
      {"model.num_key_value_heads = -1", {{"num_key_value_heads", V(int64_t{-1})}}},
      {"model.intermediate_size = 0", {{"intermediate_size", V(int64_t{0})}}},
      {"model.attention = \"flash\"", {{"attention", V(std::string("flash"))}}},
  };
  for (const auto& [needle, given] : cases) {
    SCOPED_TRACE(needle);
    const auto msg = lt_test::config_error(resolve(given));
    EXPECT_EQ(msg.rfind(needle, 0), 0u) << msg;
  }
}

}  // namespace
