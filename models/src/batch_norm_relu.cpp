// relu(batch_norm(x)) fused: Note [Fused BatchNorm and ReLU].
#include "leantrain/models/batch_norm_relu.h"
#include "leantrain/recompute/recompute.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace lt::models {

// Note [Fused BatchNorm and ReLU]
// A bottleneck's bn1 and bn2 and the stem's BatchNorm are each followed by a ReLU. Unfused,
// on the CPU in training that is, per 4-D activation of M values in C channels:
//   forward:  BatchNorm's statistics pass (reads x twice: mean, then variance), its apply pass
//             (reads x, writes a fresh y'), ReLU (reads y', writes a fresh y);
//   backward: ReLU's (reads g and y, writes a fresh g'), BatchNorm's reduction (reads g' and
//             x) and its apply pass (reads g' and x, writes dx).
// Fused, y = max(0, x * alpha + beta) is written once, and the ReLU's mask is read from y,
// which the next convolution saves anyway:
//   forward:  one statistics pass (sum and sum of squares in double), one apply pass;
//   backward: one reduction (sums of g and g * (x - mean) where y > 0), one apply pass
//             dx = A * g[y > 0] + B * (x - mean) + C'.
// No y' and no g' exist (two [M] tensors written and read per pair each way), and what is
// saved is what the two ops saved (x, and y for the mask). ResNet-50 has 33 such pairs; in
// its fp32 step (micro-batch 8 at 224 on 2 threads) the ReLUs' forward and backward were 7 %
// of the time, and three profiled steps (leantrain_bench_profile) spent ~575 ms in the pairs'
// BatchNorms and ReLUs as ATen ops, ~335 ms in the fused op (142 forward, 193 backward). The formulas are BatchNorm's (biased variance for normalising, unbiased for the
// running variance, running = (1 - momentum) * running + momentum * batch); the sums run in
// another order than ATen's, so results agree with the unfused ops to rounding (tested against
// them: Models.FusedBatchNormReluMatchesUnfused), and bitwise with themselves for a given
// thread count (each thread sums its own rows; the partial sums are added in thread order), so
// a recomputed unit's rerun reproduces its forward. Only float32 channels-last activations are
// fused (ResNet's default layout; [rows, C] with C contiguous, so every loop runs along the
// channels and vectorises); bf16 (autocast), NCHW, evaluation and CUDA run the two ops.

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The row loops, each for rows [r0, r1) of a [rows, c] channels-last activation. Built twice,
// for x86-64-v3 (AVX2, FMA) and the baseline, and picked when the library loads (GCC's and
// Clang's target_clones): the backward's loops run 3-4x faster with AVX2's blends than with
// SSE2 (the loops alone, [25088, 64]). Sums: each block of kBlockRows rows in float, the
// blocks in double.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LT_ROW_KERNEL __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define LT_ROW_KERNEL
#endif

constexpr int64_t kBlockRows = 16;

// s += sum of x, s2 += sum of x^2, per channel.
LT_ROW_KERNEL void stats_rows(const float* x, int64_t r0, int64_t r1, int64_t c, double* s, double* s2) {
  std::vector<float> buf(2 * c);
  float* __restrict a = buf.data();
  float* __restrict a2 = a + c;
  for (int64_t b = r0; b < r1; b += kBlockRows) {
    std::fill(buf.begin(), buf.end(), 0.0f);
    for (int64_t r = b, e = std::min(r1, b + kBlockRows); r < e; ++r) {
      const float* __restrict xr = x + r * c;
      for (int64_t j = 0; j < c; ++j) {
        a[j] += xr[j];
        a2[j] += xr[j] * xr[j];
      }
    }
    for (int64_t j = 0; j < c; ++j) {
      s[j] += a[j];
      s2[j] += a2[j];
    }
  }
}

// y = max(0, x * alpha + beta).
LT_ROW_KERNEL void apply_rows(const float* x, float* y, int64_t r0, int64_t r1, int64_t c, const float* alpha,
                              const float* beta) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict xr = x + r * c;
    float* __restrict yr = y + r * c;
    for (int64_t j = 0; j < c; ++j) yr[j] = std::max(0.0f, xr[j] * alpha[j] + beta[j]);
  }
}

// s1 += sum of gm, s2 += sum of gm * (x - mean), gm = g where y > 0, else 0.
LT_ROW_KERNEL void masked_sums_rows(const float* x, const float* y, const float* g, const float* mean, int64_t r0,
                                    int64_t r1, int64_t c, double* s1, double* s2) {
  std::vector<float> buf(2 * c);
  float* __restrict a = buf.data();
  float* __restrict a2 = a + c;
  for (int64_t b = r0; b < r1; b += kBlockRows) {
    std::fill(buf.begin(), buf.end(), 0.0f);
    for (int64_t r = b, e = std::min(r1, b + kBlockRows); r < e; ++r) {
      const float* __restrict xr = x + r * c;
      const float* __restrict yr = y + r * c;
      const float* __restrict gr = g + r * c;
      for (int64_t j = 0; j < c; ++j) {
        const float gm = yr[j] > 0.0f ? gr[j] : 0.0f;
        a[j] += gm;
        a2[j] += gm * (xr[j] - mean[j]);
      }
    }
    for (int64_t j = 0; j < c; ++j) {
      s1[j] += a[j];
      s2[j] += a2[j];
    }
  }
}

// dx = gm * ka + (x - mean) * kb + kc.
LT_ROW_KERNEL void input_grad_rows(const float* x, const float* y, const float* g, const float* mean, float* dx,
                                   int64_t r0, int64_t r1, int64_t c, const float* ka, const float* kb,
                                   const float* kc) {
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict xr = x + r * c;
    const float* __restrict yr = y + r * c;
    const float* __restrict gr = g + r * c;
    float* __restrict dr = dx + r * c;
    for (int64_t j = 0; j < c; ++j) {
      const float gm = yr[j] > 0.0f ? gr[j] : 0.0f;
      dr[j] = gm * ka[j] + (xr[j] - mean[j]) * kb[j] + kc[j];
    }
  }
}

constexpr int64_t kGrainValues = 32768;

// Rows per task, so a task touches at least kGrainValues values.
int64_t grain_rows(int64_t c) { return std::max<int64_t>(1, kGrainValues / std::max<int64_t>(1, c)); }

// Per-thread partial sums of two per-channel quantities over the rows, added in thread order.
// body(row_begin, row_end, a, b) adds its rows' contributions into a[0..C) and b[0..C).
template <class Body>
void channel_sums(int64_t rows, int64_t c, std::vector<double>& a, std::vector<double>& b, const Body& body) {
  const int threads = at::get_num_threads();
  std::vector<double> part(static_cast<size_t>(threads) * 2 * c, 0.0);
  std::vector<char> used(threads, 0);
  at::parallel_for(0, rows, grain_rows(c), [&](int64_t r0, int64_t r1) {
    const int t = at::get_thread_num();
    double* pa = part.data() + static_cast<size_t>(t) * 2 * c;
    body(r0, r1, pa, pa + c);
    used[t] = 1;
  });
  a.assign(c, 0.0);
  b.assign(c, 0.0);
  for (int t = 0; t < threads; ++t) {
    if (!used[t]) continue;
    const double* pa = part.data() + static_cast<size_t>(t) * 2 * c;
    for (int64_t j = 0; j < c; ++j) {
      a[j] += pa[j];
      b[j] += pa[c + j];
    }
  }
}

// The [rows, C] view of a channels-last [N, C, H, W] tensor.
int64_t rows_of(const at::Tensor& x) { return x.size(0) * x.size(2) * x.size(3); }

struct BatchNormRelu : torch::autograd::Function<BatchNormRelu> {
  // running_mean / running_var are updated in place; weight and bias are the differentiable inputs.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            at::Tensor running_mean, at::Tensor running_var, double momentum, double eps) {
    const int64_t c = x.size(1), rows = rows_of(x);
    const float* px = x.data_ptr<float>();
    std::vector<double> sum, sq;
    channel_sums(rows, c, sum, sq,
                 [&](int64_t r0, int64_t r1, double* s, double* s2) { stats_rows(px, r0, r1, c, s, s2); });
    auto mean = torch::empty({c}, x.options());
    auto invstd = torch::empty({c}, x.options());
    std::vector<float> alpha(c), beta(c);
    {
      auto rm = running_mean.accessor<float, 1>();
      auto rv = running_var.accessor<float, 1>();
      const auto w = weight.accessor<float, 1>();
      const auto b = bias.accessor<float, 1>();
      float* pm = mean.data_ptr<float>();
      float* pi = invstd.data_ptr<float>();
      const double n = static_cast<double>(rows);
      for (int64_t j = 0; j < c; ++j) {
        const double m = sum[j] / n;
        const double var = std::max(0.0, sq[j] / n - m * m);
        pm[j] = static_cast<float>(m);
        pi[j] = static_cast<float>(1.0 / std::sqrt(var + eps));
        alpha[j] = w[j] * pi[j];
        beta[j] = b[j] - pm[j] * alpha[j];
        rm[j] = static_cast<float>((1.0 - momentum) * rm[j] + momentum * m);
        rv[j] = static_cast<float>((1.0 - momentum) * rv[j] + momentum * var * n / (n - 1.0));
      }
    }
    auto y = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
    float* py = y.data_ptr<float>();
    at::parallel_for(0, rows, grain_rows(c), [&](int64_t r0, int64_t r1) {
      apply_rows(px, py, r0, r1, c, alpha.data(), beta.data());
    });
    ctx->save_for_backward({x, y, weight, mean, invstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& y = saved[1];
    const auto& weight = saved[2];
    const auto& mean = saved[3];
    const auto& invstd = saved[4];
    const auto g = grad_out[0].contiguous(at::MemoryFormat::ChannelsLast);
    const int64_t c = x.size(1), rows = rows_of(x);
    const float* px = x.data_ptr<float>();
    const float* py = y.data_ptr<float>();
    const float* pg = g.data_ptr<float>();
    const float* pm = mean.data_ptr<float>();
    // s1 = sum of g where y > 0 (the bias gradient), s2 = sum of g * (x - mean) there.
    std::vector<double> s1, s2;
    channel_sums(rows, c, s1, s2, [&](int64_t r0, int64_t r1, double* a, double* b) {
      masked_sums_rows(px, py, pg, pm, r0, r1, c, a, b);
    });
    auto grad_w = torch::empty({c}, x.options());
    auto grad_b = torch::empty({c}, x.options());
    std::vector<float> ka(c), kb(c), kc(c);
    {
      const auto w = weight.accessor<float, 1>();
      const auto is = invstd.accessor<float, 1>();
      float* gw = grad_w.data_ptr<float>();
      float* gb = grad_b.data_ptr<float>();
      const double n = static_cast<double>(rows);
      for (int64_t j = 0; j < c; ++j) {
        const double inv = is[j];
        gw[j] = static_cast<float>(s2[j] * inv);
        gb[j] = static_cast<float>(s1[j]);
        // dx = w * invstd * (gm - s1 / n - (x - mean) * invstd^2 * s2 / n)
        const double a = w[j] * inv;
        ka[j] = static_cast<float>(a);
        kb[j] = static_cast<float>(-a * inv * inv * s2[j] / n);
        kc[j] = static_cast<float>(-a * s1[j] / n);
      }
    }
    at::Tensor dx;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x, at::MemoryFormat::ChannelsLast);
      float* pd = dx.data_ptr<float>();
      at::parallel_for(0, rows, grain_rows(c), [&](int64_t r0, int64_t r1) {
        input_grad_rows(px, py, pg, pm, pd, r0, r1, c, ka.data(), kb.data(), kc.data());
      });
    }
    return {dx, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool bn_relu_fuses(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x) {
  const auto& o = bn.options;
  return bn.is_training() && o.affine() && o.track_running_stats() && bn.num_batches_tracked.defined() &&
         x.device().is_cpu() && x.scalar_type() == torch::kFloat && x.dim() == 4 &&
         x.size(1) == bn.weight.size(0) && x.size(0) * x.size(2) * x.size(3) > 1 && x.size(1) > 1 &&
         x.is_contiguous(at::MemoryFormat::ChannelsLast) && bn.weight.scalar_type() == torch::kFloat &&
         bn.running_mean.scalar_type() == torch::kFloat && bn.running_var.scalar_type() == torch::kFloat &&
         bn.weight.is_contiguous() && bn.bias.is_contiguous() && bn.running_mean.is_contiguous() &&
         bn.running_var.is_contiguous();
}

torch::Tensor bn_relu(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x, bool fused) {
  if (!fused || !bn_relu_fuses(bn, x)) return torch::relu(bn.forward(x));
  const double factor = lt::recompute::count_batch(bn);
  RECORD_FUNCTION("lt::bn_relu", std::vector<c10::IValue>({x}));
  return BatchNormRelu::apply(x, bn.weight, bn.bias, bn.running_mean, bn.running_var, factor, bn.options.eps());
}

}  // namespace lt::models
