// Note [CPU kernels for the tanh GELU and the loss's softmax]: the GELU kernel and its backward
// against the tanh GELU in double (and against ATen's float and bf16 kernels), and the loss's
// softmax rows against cross-entropy in double; thread-count independence, NaN, bad targets.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "leantrain/recompute/cpu_kernels.h"
#include "leantrain/runtime/errors.h"

namespace lr = lt::recompute;

namespace {

// x: a spread of values (normal * 4), the special points, and sizes around the vector width
// and past one parallel task.
torch::Tensor gelu_inputs(int64_t n) {
  torch::manual_seed(3);
  auto x = torch::randn({n}) * 4;
  const auto special = torch::tensor({0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 3.0f, -3.0f, 5.0f, -5.0f, 9.0f, -9.0f, 20.0f,
                                      -20.0f, 90.0f, -90.0f, 1e4f, -1e4f});
  x.narrow(0, 0, std::min<int64_t>(n, special.numel())).copy_(special.narrow(0, 0, std::min<int64_t>(n, special.numel())));
  return x;
}

// Largest |a - b| / (atol + rtol |b|).
double worst(const torch::Tensor& a, const torch::Tensor& b, double atol, double rtol) {
  const auto ad = a.to(torch::kDouble), bd = b.to(torch::kDouble);
  return ((ad - bd).abs() / (atol + rtol * bd.abs())).max().item<double>();
}

}  // namespace

TEST(CpuKernels, TanhGeluAndItsGradientMatchDouble) {
  for (const int64_t n : {1, 15, 17, 1000, 100003}) {
    SCOPED_TRACE(n);
    const auto x = gelu_inputs(n);
    ASSERT_TRUE(lr::gelu_kernel_applies(x, "tanh"));
    const auto g = torch::randn({n});
    const auto xd = x.to(torch::kDouble);
    const auto ref = at::gelu(xd, "tanh");
    const auto ref_grad = at::gelu_backward(g.to(torch::kDouble), xd, "tanh");
    const auto y = lr::gelu(x, "tanh");
    const auto d = lr::gelu_backward(g, x, "tanh");
    EXPECT_EQ(y.scalar_type(), torch::kFloat);
    EXPECT_EQ(d.scalar_type(), torch::kFloat);
    // Within 2e-6 relative or 1e-6 absolute of the double GELU, and no further than ATen's
    // float kernel (its own error, where 1 + tanh z cancels, is larger).
    EXPECT_LE(worst(y, ref, 1e-6, 2e-6), 1.0);
    EXPECT_LE(worst(d, ref_grad, 1e-6, 2e-6), 1.0);
    EXPECT_LE((y.to(torch::kDouble) - ref).abs().max().item<double>(),
              std::max(1e-6, (at::gelu(x, "tanh").to(torch::kDouble) - ref).abs().max().item<double>()));
    // Deterministic, and a non-contiguous input computes the same values.
    EXPECT_TRUE(torch::equal(y, lr::gelu(x, "tanh")));
    if (n > 1) {
      const auto x2 = torch::stack({x, x}, 1);  // [n, 2]; column 0 is strided
      EXPECT_TRUE(torch::equal(lr::gelu(x2.select(1, 0), "tanh"), y));
    }
  }
}

TEST(CpuKernels, TanhGeluInBf16RoundsItsFloatResultOnce) {
  const auto x = gelu_inputs(4099).to(torch::kBFloat16);
  const auto g = torch::randn({4099}).to(torch::kBFloat16);
  const auto y = lr::gelu(x, "tanh");
  const auto d = lr::gelu_backward(g, x, "tanh");
  ASSERT_EQ(y.scalar_type(), torch::kBFloat16);
  ASSERT_EQ(d.scalar_type(), torch::kBFloat16);
  // The float result rounded once: within half a bf16 ulp (2^-8 relative at most) of the
  // double value, plus the float kernel's own error; and no further than ATen's bf16 kernel.
  const auto ref = at::gelu(x.to(torch::kDouble), "tanh");
  const auto ref_grad = at::gelu_backward(g.to(torch::kDouble), x.to(torch::kDouble), "tanh");
  const double rtol = std::ldexp(1.0, -8) + 2e-6;
  EXPECT_LE(worst(y, ref, 1e-6, rtol), 1.0);
  EXPECT_LE(worst(d, ref_grad, 1e-6, rtol), 1.0);
  EXPECT_LE(worst(y, ref, 1e-6, rtol), std::max(0.5, worst(at::gelu(x, "tanh"), ref, 1e-6, rtol)));
  EXPECT_LE(worst(d, ref_grad, 1e-6, rtol), std::max(0.5, worst(at::gelu_backward(g, x, "tanh"), ref_grad, 1e-6, rtol)));
  // The same as rounding this library's float result.
  EXPECT_TRUE(torch::equal(y, lr::gelu(x.to(torch::kFloat), "tanh").to(torch::kBFloat16)));
  EXPECT_TRUE(torch::equal(d, lr::gelu_backward(g.to(torch::kFloat), x.to(torch::kFloat), "tanh").to(torch::kBFloat16)));
}

TEST(CpuKernels, GeluAutogradAndTheCasesLeftToAten) {
  // With autograd: the gradient is gelu_backward's.
  const auto x0 = gelu_inputs(257);
  auto x = x0.clone().requires_grad_(true);
  const auto up = torch::randn({257});
  (lr::gelu_autograd(x, "tanh") * up).sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), lr::gelu_backward(up, x0, "tanh")));
  // The erf GELU, doubles and mixed dtypes run ATen's ops, bitwise.
  EXPECT_FALSE(lr::gelu_kernel_applies(x0, "none"));
  EXPECT_FALSE(lr::gelu_kernel_applies(x0.to(torch::kDouble), "tanh"));
  EXPECT_FALSE(lr::gelu_kernel_applies(x0.to(torch::kHalf), "tanh"));
  EXPECT_TRUE(torch::equal(lr::gelu(x0, "none"), at::gelu(x0, "none")));
  EXPECT_TRUE(torch::equal(lr::gelu_backward(up, x0, "none"), at::gelu_backward(up, x0, "none")));
  EXPECT_TRUE(torch::equal(lr::gelu_backward(up.to(torch::kDouble), x0, "tanh"),
                           at::gelu_backward(up.to(torch::kDouble), x0, "tanh")));
  auto xe = x0.clone().requires_grad_(true);
  (lr::gelu_autograd(xe, "none") * up).sum().backward();
  auto xa = x0.clone().requires_grad_(true);
  (torch::gelu(xa, "none") * up).sum().backward();
  EXPECT_TRUE(torch::equal(xe.grad(), xa.grad()));
}

TEST(CpuKernels, SoftmaxCrossEntropyRowsMatchDouble) {
  torch::manual_seed(5);
  const int64_t n = 37, v = 1003;  // not a multiple of the 16 lanes
  auto logits = torch::randn({n, v}) * 5;
  logits[1] += 1000.0f;                         // a large offset: the max is subtracted
  logits[2] = torch::linspace(-200, 30, v);     // a spread past exp's clamp
  const auto target = torch::randint(0, v, {n});
  const double scale = 1.0 / 53.0;
  const auto ld = logits.to(torch::kDouble);
  const auto ref_loss = torch::nn::functional::cross_entropy(
                            ld, target, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                            .item<double>();
  const auto ref_grad = (torch::softmax(ld, 1) - torch::one_hot(target, v).to(torch::kDouble)) * scale;
  ASSERT_TRUE(lr::softmax_xent_kernel_applies(logits));
  auto x = logits.clone();
  const double loss = lr::softmax_xent_grad_(x, target, scale);
  EXPECT_NEAR(loss, ref_loss, 1e-6 * std::abs(ref_loss));
  EXPECT_LE((x.to(torch::kDouble) - ref_grad).abs().max().item<double>(), 1e-7 * scale * 10);
  EXPECT_NEAR(x.sum(1).abs().max().item<double>(), 0.0, 1e-6 * scale);  // each row's gradient sums to 0
  // The thread count does not change a bit.
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  auto x1 = logits.clone();
  const double loss1 = lr::softmax_xent_grad_(x1, target, scale);
  at::set_num_threads(threads);
  EXPECT_EQ(loss1, loss);
  EXPECT_TRUE(torch::equal(x1, x));
  // A NaN logit makes the loss NaN.
  auto xn = logits.clone();
  xn[4][7] = std::nanf("");
  EXPECT_TRUE(std::isnan(lr::softmax_xent_grad_(xn, target, scale)));
  // A target outside the vocabulary is named, and nothing is written.
  auto xb = logits.clone();
  auto bad = target.clone();
  bad[5] = v;
  try {
    lr::softmax_xent_grad_(xb, bad, scale);
    FAIL() << "target " << v << " was accepted";
  } catch (const lt::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("row 5"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(xb, logits));
  EXPECT_FALSE(lr::softmax_xent_kernel_applies(logits.t()));
  EXPECT_FALSE(lr::softmax_xent_kernel_applies(logits.to(torch::kBFloat16)));
}
