// The MLP that computes GELU's output again in backward instead of keeping it (Note [GELU
// recomputed in the MLP's backward], models/src/transformer.cpp) against the plain autograd
// graph of proj(gelu(fc(x))) (FeedForwardImpl::recompute_gelu = false): the output and every
// gradient bitwise in fp32, fp64, bf16 and fp16 autocast, 2D and 3D inputs, tanh and exact
// GELU; frozen parameters and inputs without a gradient; under recompute; the bytes kept from
// forward to backward; whole GPT and BERT steps under each recompute policy.
#include <gtest/gtest.h>
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "autograd_nodes.h"
#include "leantrain/models/attention.h"
#include "leantrain/models/model.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/memory_meter.h"

namespace {

using lt::models::FeedForwardImpl;

// CPU or CUDA autocast to `dtype` for a scope (nullopt: nothing), restoring what was there.
struct Autocast {
  const std::optional<at::ScalarType> dtype;
  const at::DeviceType device;
  const bool before;
  const at::ScalarType dtype_before;
  Autocast(std::optional<at::ScalarType> to, at::DeviceType dev)
      : dtype(to), device(dev), before(at::autocast::is_autocast_enabled(dev)),
        dtype_before(at::autocast::get_autocast_dtype(dev)) {
    if (!dtype) return;
    at::autocast::set_autocast_dtype(device, *dtype);
    at::autocast::set_autocast_enabled(device, true);
  }
  ~Autocast() {
    if (!dtype) return;
    at::autocast::set_autocast_enabled(device, before);
    at::autocast::set_autocast_dtype(device, dtype_before);
    at::autocast::clear_cache();
  }
};

std::shared_ptr<FeedForwardImpl> make_ff(const std::string& approximate, c10::ScalarType dtype = torch::kFloat,
                                         c10::Device device = torch::kCPU, int64_t d = 32, int64_t f = 128) {
  torch::manual_seed(5);
  auto ff = std::make_shared<FeedForwardImpl>(d, f, approximate);
  {
    torch::NoGradGuard no_grad;
    // Weights as a trained model has them (not LibTorch's uniform init), non-zero biases.
    for (auto& p : ff->parameters()) p.normal_(0.0, p.dim() == 2 ? 0.1 : 0.5);
  }
  ff->to(device, dtype);
  ff->train();
  return ff;
}

bool runs_gelu_linear(const torch::Tensor& out) {
  return out.grad_fn() && out.grad_fn()->name().find("GeluLinear") != std::string::npos;
}

struct Result {
  torch::Tensor out, dx;
  std::vector<torch::Tensor> grads;  // fc.weight, fc.bias, proj.weight, proj.bias
  bool custom = false;
};

// out = ff(x) under the given autocast, then backward of a fixed upstream gradient.
Result run(FeedForwardImpl& ff, bool recompute_gelu, const torch::Tensor& x0, const torch::Tensor& upstream,
        std::optional<at::ScalarType> autocast) {
  for (auto& p : ff.parameters()) p.mutable_grad() = torch::Tensor();
  ff.recompute_gelu = recompute_gelu;
  auto x = x0.detach().clone().requires_grad_(x0.requires_grad());
  Result r;
  {
    Autocast ac(autocast, x.device().type());
    r.out = ff.forward(x);
  }
  r.custom = runs_gelu_linear(r.out);
  if (r.out.requires_grad()) r.out.backward(upstream.to(r.out.scalar_type()));
  r.out = r.out.detach();
  r.dx = x.grad();
  for (auto& p : ff.parameters()) r.grads.push_back(p.grad());
  ff.recompute_gelu = true;
  return r;
}

void expect_same(const torch::Tensor& a, const torch::Tensor& b, const std::string& what) {
  ASSERT_EQ(a.defined(), b.defined()) << what;
  if (!a.defined()) return;
  EXPECT_EQ(a.scalar_type(), b.scalar_type()) << what;
  EXPECT_TRUE(torch::equal(a, b)) << what << ": max |diff| "
                                  << (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

void expect_same(const Result& a, const Result& b) {
  expect_same(a.out, b.out, "output");
  expect_same(a.dx, b.dx, "input gradient");
  const char* names[] = {"fc.weight", "fc.bias", "proj.weight", "proj.bias"};
  ASSERT_EQ(a.grads.size(), 4u);
  for (size_t i = 0; i < 4; ++i) expect_same(a.grads[i], b.grads[i], std::string(names[i]) + " gradient");
}

struct Precision {
  const char* name;
  c10::ScalarType params;                // the parameters' and input's dtype
  std::optional<at::ScalarType> autocast;
};
const Precision kPrecisions[] = {{"fp32", torch::kFloat, std::nullopt},
                                 {"fp64", torch::kDouble, std::nullopt},
                                 {"bf16 autocast", torch::kFloat, at::kBFloat16},
                                 {"fp16 autocast", torch::kFloat, at::kHalf}};

void check_bitwise(c10::Device device) {
  for (const auto& prec : kPrecisions)
    for (const char* approximate : {"tanh", "none"})
      for (const std::vector<int64_t> lead : {std::vector<int64_t>{24}, std::vector<int64_t>{3, 16}}) {
        SCOPED_TRACE(std::string(prec.name) + ", gelu " + approximate + ", " + std::to_string(lead.size() + 1) + "D");
        auto ff = make_ff(approximate, prec.params, device);
        auto shape = lead;
        shape.push_back(32);
        torch::manual_seed(6);
        const auto opts = torch::TensorOptions().dtype(prec.params).device(device);
        const auto x = torch::randn(shape, opts).requires_grad_(true);
        const auto upstream = torch::randn(shape, opts);
        const auto now = run(*ff, true, x, upstream, prec.autocast);
        const auto plain = run(*ff, false, x, upstream, prec.autocast);
        EXPECT_TRUE(now.custom);
        EXPECT_FALSE(plain.custom);
        EXPECT_EQ(now.out.scalar_type(), prec.autocast ? *prec.autocast : prec.params);
        expect_same(now, plain);
      }
}

TEST(FeedForward, MatchesThePlainExpressionBitwise) { check_bitwise(torch::kCPU); }

TEST(FeedForward, MatchesThePlainExpressionBitwiseOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  check_bitwise(torch::Device(torch::kCUDA, 0));
}

// Parameters that do not require a gradient (frozen) and inputs that do not: the same
// gradients defined, and equal; with nothing requiring one, or outside grad mode, the plain
// expression runs.
TEST(FeedForward, FrozenParametersAndInputsWithoutAGradient) {
  struct Case {
    const char* name;
    bool x, fc, proj_weight, proj_bias;
  };
  const Case cases[] = {{"proj frozen", true, true, false, false},
                        {"fc frozen, input without gradient", false, false, true, true},
                        {"proj.bias frozen", true, true, true, false},
                        {"proj.weight frozen", true, true, false, true},
                        {"only the input", true, false, false, false}};
  for (const auto& prec : kPrecisions)
    for (const auto& c : cases) {
      SCOPED_TRACE(std::string(prec.name) + ", " + c.name);
      auto ff = make_ff("tanh", prec.params);
      ff->fc->weight.requires_grad_(c.fc);
      ff->fc->bias.requires_grad_(c.fc);
      ff->proj->weight.requires_grad_(c.proj_weight);
      ff->proj->bias.requires_grad_(c.proj_bias);
      torch::manual_seed(6);
      const auto x = torch::randn({2, 8, 32}, prec.params).requires_grad_(c.x);
      const auto upstream = torch::randn({2, 8, 32}, prec.params);
      const auto now = run(*ff, true, x, upstream, prec.autocast);
      const auto plain = run(*ff, false, x, upstream, prec.autocast);
      EXPECT_TRUE(now.custom);
      expect_same(now, plain);
    }
  auto ff = make_ff("tanh");
  for (auto& p : ff->parameters()) p.requires_grad_(false);
  const auto x = torch::randn({2, 8, 32});
  auto out = ff->forward(x);
  EXPECT_FALSE(out.requires_grad());
  for (auto& p : ff->parameters()) p.requires_grad_(true);
  torch::Tensor no_grad_out;
  {
    torch::NoGradGuard no_grad;
    no_grad_out = ff->forward(x);
  }
  EXPECT_FALSE(no_grad_out.requires_grad());
  EXPECT_TRUE(torch::equal(out, no_grad_out));
}

// Under lt::recompute::in_backward (the `full` policy's rerun, grad mode on, the forward's
// autocast state restored): the rerun runs the plain expression (recompute::rerunning(); its
// graph lives only until its own backward), so the gradients are those with
// recompute_gelu = false, and no GeluLinear node is made either way.
TEST(FeedForward, UnderRecomputeTheRerunRunsThePlainExpression) {
  for (const auto& prec : kPrecisions)
    for (const char* approximate : {"tanh", "none"}) {
      SCOPED_TRACE(std::string(prec.name) + ", gelu " + approximate);
      auto ff = make_ff(approximate, prec.params);
      torch::manual_seed(6);
      const auto x0 = torch::randn({2, 8, 32}, prec.params);
      const auto upstream = torch::randn({2, 8, 32}, prec.params);
      auto recomputed = [&](bool recompute_gelu) {
        for (auto& p : ff->parameters()) p.mutable_grad() = torch::Tensor();
        ff->recompute_gelu = recompute_gelu;
        auto x = x0.clone().requires_grad_(true);
        bool custom = false;
        auto fn = [&](const std::vector<torch::Tensor>& in) {
          auto y = ff->forward(in[0]);
          custom = custom || runs_gelu_linear(y);
          return y;
        };
        torch::Tensor out;
        {
          Autocast ac(prec.autocast, at::kCPU);
          out = lt::recompute::in_backward(fn, {x}, ff->parameters());
        }
        out.backward(upstream.to(out.scalar_type()));
        ff->recompute_gelu = true;
        Result r{out.detach(), x.grad(), {}, custom};
        for (auto& p : ff->parameters()) r.grads.push_back(p.grad());
        return r;
      };
      const auto now = recomputed(true), plain = recomputed(false);
      EXPECT_FALSE(now.custom);  // not in the rerun
      EXPECT_FALSE(plain.custom);
      expect_same(now, plain);
    }
}

// Note [A unit's last product is not rerun]: forward_for_gradients builds the graph forward
// builds, with an UnreadLinear node for proj and zeros for its output, so x + mlp(x) gives
// bitwise the gradients of the plain expression in every precision, GELU and rank; under
// in_backward with it as the `rerun` (as Model::apply_recompute passes a GPT block's), the
// checkpointed gradients are bitwise the plain graph's and the rerun ran it.
TEST(FeedForward, ForwardForGradientsSkipsTheLastProductAndKeepsEveryGradient) {
  for (const auto& prec : kPrecisions)
    for (const char* approximate : {"tanh", "none"})
      for (const std::vector<int64_t> lead : {std::vector<int64_t>{24}, std::vector<int64_t>{3, 16}}) {
        SCOPED_TRACE(std::string(prec.name) + ", gelu " + approximate + ", " + std::to_string(lead.size() + 1) + "D");
        auto ff = make_ff(approximate, prec.params);
        auto shape = lead;
        shape.push_back(32);
        torch::manual_seed(6);
        const auto x0 = torch::randn(shape, prec.params);
        const auto upstream = torch::randn(shape, prec.params);
        auto grads = [&](int mode) {  // 0: forward; 1: forward_for_gradients; 2: in_backward with it as rerun
          for (auto& p : ff->parameters()) p.mutable_grad() = torch::Tensor();
          auto x = x0.clone().requires_grad_(true);
          torch::Tensor out;
          int unread_nodes = -1;
          bool reran = false;
          {
            Autocast ac(prec.autocast, at::kCPU);
            auto fwd = [&](const std::vector<torch::Tensor>& in) { return in[0] + ff->forward(in[0]); };
            auto rerun = [&](const std::vector<torch::Tensor>& in) {
              auto y = ff->forward_for_gradients(in[0]);
              unread_nodes = lt_test::count_nodes(y, "UnreadLinear");
              EXPECT_TRUE(torch::equal(y, torch::zeros_like(y)));
              reran = true;
              return in[0] + y;
            };
            if (mode == 0) out = fwd({x});
            else if (mode == 1) out = rerun({x});
            else out = lt::recompute::in_backward(fwd, {x}, ff->parameters(), std::vector<torch::nn::Module*>{}, rerun);
          }
          out.backward(upstream.to(out.scalar_type()));
          Result r{torch::Tensor(), x.grad(), {}, false};
          for (auto& p : ff->parameters()) r.grads.push_back(p.grad());
          if (mode > 0) {
            EXPECT_TRUE(reran);
            EXPECT_EQ(unread_nodes, 1);
          }
          return r;
        };
        const auto plain = grads(0);
        expect_same(grads(1), plain);
        expect_same(grads(2), plain);
      }
}

// Bytes kept from the MLP's forward to its backward (the tracking allocator), output excluded.
int64_t kept(bool recompute_gelu, std::optional<at::ScalarType> autocast, int64_t n, int64_t d, int64_t f) {
  auto ff = make_ff("tanh", torch::kFloat, torch::kCPU, d, f);
  ff->recompute_gelu = recompute_gelu;
  torch::manual_seed(6);
  auto x = torch::randn({n / 8, 8, d}).requires_grad_(true);
  lt::MemoryMeter meter(-1);
  const int64_t base = meter.stats().current_bytes;
  torch::Tensor out;
  {
    Autocast ac(autocast, at::kCPU);
    out = ff->forward(x);
  }  // autocast's cast cache cleared, as at the end of a training forward
  const int64_t bytes = meter.stats().current_bytes - base - static_cast<int64_t>(out.nbytes());
  out.sum().backward();
  return bytes;
}

// What goes: the GELU output [N,F] (in fp32, the whole difference); under autocast also proj's
// low-precision weight copy [D,F], which the plain graph's matmul keeps (backward casts again).
TEST(FeedForward, KeepsNeitherTheGeluOutputNorProjsWeightCast) {
  const int64_t n = 256, d = 64, f = 256;
  const int64_t fp32 = kept(false, std::nullopt, n, d, f) - kept(true, std::nullopt, n, d, f);
  const int64_t bf16 = kept(false, at::kBFloat16, n, d, f) - kept(true, at::kBFloat16, n, d, f);
  ::testing::Test::RecordProperty("fp32_saved", std::to_string(fp32));
  ::testing::Test::RecordProperty("bf16_saved", std::to_string(bf16));
  EXPECT_EQ(fp32, n * f * 4);
  EXPECT_EQ(bf16, n * f * 2 + d * f * 2);
  // What stays in fp32: fc's output (GELU's input), and fc's saved input is the caller's x.
  EXPECT_EQ(kept(true, std::nullopt, n, d, f), n * f * 4);
}

lt::models::ModelConfig tiny(const std::string& kind, double dropout) {
  lt::models::ModelConfig c;
  c.kind = kind;
  c.vocab_size = 96;
  c.seq_len = 32;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.dropout = dropout;
  c.attention = "sdpa";
  return c;
}

struct Step {
  double loss;
  std::vector<torch::Tensor> grads;
  int64_t custom;  // GeluLinear nodes in the forward's graph (under full only the last block's, which is not rerun)
};

int64_t gelu_linear_nodes(const torch::Tensor& out) { return lt_test::count_nodes(out, "GeluLinear"); }

Step model_step(const lt::models::ModelConfig& c, const std::string& policy, bool bf16, bool recompute_gelu) {
  torch::manual_seed(11);
  auto model = lt::models::build_model(c);
  model->train();
  {
    // Non-zero biases and LayerNorm parameters off 1 and 0, as in a trained model (a zero
    // bias would hide how it is added).
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters())
      if (p.dim() == 1) p.add_(torch::randn_like(p), 0.1);
  }
  lt::models::apply_recompute_policy(*model, lt::recompute::RecomputePolicy::parse(policy));
  for (auto& m : model->modules())
    if (auto* ff = dynamic_cast<FeedForwardImpl*>(m.get())) ff->recompute_gelu = recompute_gelu;
  torch::manual_seed(12);
  auto x = torch::randint(0, c.vocab_size, {3, c.seq_len});
  auto y = torch::randint(0, c.vocab_size, {3, c.seq_len});
  if (c.kind == "bert") y = torch::where(torch::rand({3, c.seq_len}) < 0.15, y, torch::full_like(y, -100));
  torch::manual_seed(13);  // the dropout masks
  torch::Tensor loss;
  {
    Autocast ac(bf16 ? std::optional<at::ScalarType>(at::kBFloat16) : std::nullopt, at::kCPU);
    loss = model->forward_loss(x, y);
  }
  const int64_t custom = gelu_linear_nodes(loss);
  loss.backward();
  Step s{loss.item<double>(), {}, custom};
  for (auto& p : model->parameters()) s.grads.push_back(p.grad());
  return s;
}

// Whole GPT and BERT training steps: the loss and every parameter gradient bitwise those of the
// plain MLP graph, with and without dropout, in fp32 and bf16 autocast, under each policy.
TEST(FeedForward, GptAndBertStepsAreBitwiseThePlainGraphs) {
  for (const char* kind : {"gpt", "bert"})
    for (const double dropout : {0.0, 0.1})
      for (const bool bf16 : {false, true})
        for (const char* policy : {"none", "selective", "full"}) {
          SCOPED_TRACE(std::string(kind) + ", dropout " + std::to_string(dropout) + (bf16 ? ", bf16" : ", fp32") +
                       ", recompute " + policy);
          const int64_t c_layers = tiny(kind, dropout).n_layer;
          const auto now = model_step(tiny(kind, dropout), policy, bf16, true);
          const auto plain = model_step(tiny(kind, dropout), policy, bf16, false);
          // Under full the reruns run the plain expression; the last block is not rerun.
          EXPECT_EQ(now.custom, std::string(policy) == "full" ? 1 : c_layers);
          EXPECT_EQ(plain.custom, 0);
          EXPECT_EQ(now.loss, plain.loss);
          ASSERT_EQ(now.grads.size(), plain.grads.size());
          for (size_t i = 0; i < now.grads.size(); ++i) expect_same(now.grads[i], plain.grads[i], "gradient " + std::to_string(i));
        }
}

}  // namespace
