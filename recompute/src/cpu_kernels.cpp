// The tanh GELU and the LM loss's softmax rows on the CPU: Note [CPU kernels for the tanh GELU
// and the loss's softmax].
#include "leantrain/recompute/cpu_kernels.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "leantrain/runtime/errors.h"

namespace lt::recompute {

// Note [CPU kernels for the tanh GELU and the loss's softmax]
// Two ops of a GPT step run well below what the CPU does on their bytes, in ATen 2.11 on the
// 2-core Xeon of the benchmarks (AVX-512):
// - the tanh GELU (GPT-2's) over [1024, 3072] fp32: 3.9 ms forward on 2 threads, where
//   torch.tanh over the same values takes 0.7 ms; gelu_backward 3.7 ms. A GPT-6L fp32 step with
//   full recompute runs 24 forwards and 12 backwards of that size: ~230 ms of its ~5.1 s
//   (leantrain_bench_profile).
// - the fused LM loss's chunk (Note [Fused LM loss]): alone, _log_softmax over [512, 50257]
//   fp32 takes 32 ms (softmax 16 ms), and exp_ and mul_ each make another pass over the 103 MB;
//   in that profiled step 36 + 7 + 4 ms per chunk, four chunks per step of 2 x 1024 tokens.
// Here both are loops the compiler vectorises, built (target_clones) for x86-64-v4 (AVX-512),
// v3 (AVX2, FMA) and the baseline and picked when the library loads, over one exp:
// - exp_f: Cephes' expf (degree-6 polynomial after reducing by n ln 2 in two parts, 2^n put
//   into the exponent bits), branch-free, its argument clamped to [-87, 88] so 2^n stays a
//   normal float: within 2 ulp of exp over that range.
// - GELU: 0.5 x (1 + tanh z) with z = sqrt(2/pi) (x + 0.044715 x^3) is x * sigmoid(2z) =
//   x / (1 + exp(-2z)), the same function with no 1 + tanh z to cancel for negative x
//   (ATen's float formula loses most digits there: at x = -5 its 1 + tanh z is 1 - 0.9999999).
//   Its derivative is s + 2 x s (1 - s) sqrt(2/pi) (1 + 3 * 0.044715 x^2), s = sigmoid(2z).
//   Against the tanh GELU in double: within 1.3e-6 relative where |gelu| > 1e-3, and
//   5.2e-7 absolute (ATen's float kernel is the reference the tests hold it to, within the
//   same tolerance). bf16 tensors are widened to float and the result rounded to nearest even,
//   as ATen's bf16 kernel does.
// - The loss's rows: per row, its max; then e = exp(x - max) written over x while summing e
//   (16 float lanes, the lanes then summed in double); the row's loss log(sum) + max - x[t];
//   then x = e * scale / sum and x[t] -= scale: the gradient (softmax - onehot) * scale that
//   _log_softmax, gather, exp_, scatter_add_ and mul_ computed, in three passes over a row that
//   stays in L2 (50257 floats: 201 KB), not five over the chunk. The rows' losses are summed
//   in row order in double, so the result does not depend on the thread count.
// Measured on those shapes, 2 threads, against the ATen ops in the same run
// (build/bin/leantrain_bench_kernels, medians): GELU forward 4.5 -> 1.3 ms (bf16 4.5 -> 1.8),
// backward 4.7 -> 1.8 ms (bf16 4.6 -> 2.0); a loss chunk 32 -> 13 ms. CUDA tensors and other dtypes run the ATen ops; the erf GELU
// (BERT's) is fast in ATen and stays there.

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LT_VEC_KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define LT_VEC_KERNEL
#endif

inline float exp_f(float x) {
  x = x < -87.0f ? -87.0f : x;  // ternaries, not fmin/fmax: these vectorise (NaN passes through)
  x = x > 88.0f ? 88.0f : x;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kMagic;
  const float n = t - kMagic;
  float r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t ti;
  std::memcpy(&ti, &t, sizeof ti);
  const int32_t bits = (ti - 0x4B400000 + 127) << 23;  // n's integer, biased, in the exponent
  float scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kKappa = 0.044715f;

inline float gelu_value(float x) {
  const float z = kSqrt2OverPi * (x + kKappa * x * x * x);
  return x / (1.0f + exp_f(-2.0f * z));
}

inline float gelu_grad(float g, float x) {
  const float x2 = x * x;
  const float z = kSqrt2OverPi * (x + kKappa * x2 * x);
  const float s = 1.0f / (1.0f + exp_f(-2.0f * z));
  return g * (s + 2.0f * x * s * (1.0f - s) * kSqrt2OverPi * (1.0f + 3.0f * kKappa * x2));
}

inline float widen(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Round to nearest even; NaN stays a (quiet) NaN: c10::BFloat16's rounding.
inline uint16_t round_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return (u & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

LT_VEC_KERNEL void gelu_f32(const float* __restrict x, float* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gelu_value(x[i]);
}

LT_VEC_KERNEL void gelu_bf16(const uint16_t* __restrict x, uint16_t* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = round_bf16(gelu_value(widen(x[i])));
}

LT_VEC_KERNEL void gelu_grad_f32(const float* __restrict g, const float* __restrict x, float* __restrict d,
                                 int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = gelu_grad(g[i], x[i]);
}

LT_VEC_KERNEL void gelu_grad_bf16(const uint16_t* __restrict g, const uint16_t* __restrict x,
                                  uint16_t* __restrict d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = round_bf16(gelu_grad(widen(g[i]), widen(x[i])));
}

constexpr int kLanes = 16;

// One row of the loss: see the Note. Returns -log softmax(x)[t].
LT_VEC_KERNEL double xent_row(float* __restrict x, int64_t v, int64_t t, float scale) {
  float m[kLanes];
  for (int l = 0; l < kLanes; ++l) m[l] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= v; j += kLanes)
    for (int l = 0; l < kLanes; ++l) m[l] = x[j + l] > m[l] ? x[j + l] : m[l];
  float mx = -std::numeric_limits<float>::infinity();
  for (; j < v; ++j) mx = x[j] > mx ? x[j] : mx;
  for (int l = 0; l < kLanes; ++l) mx = m[l] > mx ? m[l] : mx;
  const float xt = x[t];
  float s[kLanes] = {};
  for (j = 0; j + kLanes <= v; j += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const float e = exp_f(x[j + l] - mx);
      x[j + l] = e;
      s[l] += e;
    }
  double sum = 0.0;
  for (; j < v; ++j) {
    const float e = exp_f(x[j] - mx);
    x[j] = e;
    sum += e;
  }
  for (int l = 0; l < kLanes; ++l) sum += s[l];
  const float k = static_cast<float>(scale / sum);
  for (j = 0; j < v; ++j) x[j] *= k;
  x[t] -= scale;
  // NaN anywhere in the row: the max skips it, its exp is NaN, so is the sum and this loss.
  return std::log(sum) + static_cast<double>(mx) - static_cast<double>(xt);
}

constexpr int64_t kGrain = 16384;  // elements per task: ~20 us of GELU

template <class F>
void for_chunks(int64_t n, F f) {
  at::parallel_for(0, n, kGrain, [&](int64_t b, int64_t e) { f(b, e - b); });
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Gelu : torch::autograd::Function<Gelu> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::string& approximate) {
    ctx->save_for_backward({x});
    ctx->saved_data["approximate"] = approximate;
    return gelu(x, approximate);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto x = ctx->get_saved_variables()[0];
    return {gelu_backward(grad_out[0], x, ctx->saved_data["approximate"].toStringRef()), at::Tensor()};
  }
};

}  // namespace

bool gelu_kernel_applies(const at::Tensor& x, const std::string& approximate) {
  return approximate == "tanh" && x.device().is_cpu() && !x.is_sparse() &&
         (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16);
}

at::Tensor gelu(const at::Tensor& x, const std::string& approximate) {
  if (!gelu_kernel_applies(x, approximate)) return at::gelu(x, approximate);
  RECORD_FUNCTION("lt::gelu", std::vector<c10::IValue>({x}));
  const auto xc = x.contiguous();
  auto y = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t n = xc.numel();
  if (xc.scalar_type() == at::kFloat) {
    const float* xp = xc.const_data_ptr<float>();
    float* yp = y.mutable_data_ptr<float>();
    for_chunks(n, [&](int64_t b, int64_t len) { gelu_f32(xp + b, yp + b, len); });
  } else {
    const auto* xp = reinterpret_cast<const uint16_t*>(xc.const_data_ptr<at::BFloat16>());
    auto* yp = reinterpret_cast<uint16_t*>(y.mutable_data_ptr<at::BFloat16>());
    for_chunks(n, [&](int64_t b, int64_t len) { gelu_bf16(xp + b, yp + b, len); });
  }
  return y;
}

at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x, const std::string& approximate) {
  if (!gelu_kernel_applies(x, approximate) || grad.scalar_type() != x.scalar_type() || grad.sizes() != x.sizes() ||
      !grad.device().is_cpu())
    return at::gelu_backward(grad, x, approximate);
  RECORD_FUNCTION("lt::gelu_backward", std::vector<c10::IValue>({grad, x}));
  const auto xc = x.contiguous();
  const auto gc = grad.contiguous();
  auto d = at::empty_like(xc, at::MemoryFormat::Contiguous);
  const int64_t n = xc.numel();
  if (xc.scalar_type() == at::kFloat) {
    const float* xp = xc.const_data_ptr<float>();
    const float* gp = gc.const_data_ptr<float>();
    float* dp = d.mutable_data_ptr<float>();
    for_chunks(n, [&](int64_t b, int64_t len) { gelu_grad_f32(gp + b, xp + b, dp + b, len); });
  } else {
    const auto* xp = reinterpret_cast<const uint16_t*>(xc.const_data_ptr<at::BFloat16>());
    const auto* gp = reinterpret_cast<const uint16_t*>(gc.const_data_ptr<at::BFloat16>());
    auto* dp = reinterpret_cast<uint16_t*>(d.mutable_data_ptr<at::BFloat16>());
    for_chunks(n, [&](int64_t b, int64_t len) { gelu_grad_bf16(gp + b, xp + b, dp + b, len); });
  }
  return d;
}

at::Tensor gelu_autograd(const at::Tensor& x, const std::string& approximate) {
  if (!gelu_kernel_applies(x, approximate)) return torch::gelu(x, approximate);
  return Gelu::apply(x, approximate);
}

bool softmax_xent_kernel_applies(const at::Tensor& logits) {
  return logits.device().is_cpu() && logits.scalar_type() == at::kFloat && logits.dim() == 2 &&
         logits.is_contiguous() && logits.size(1) > 0;
}

double softmax_xent_grad_(at::Tensor& logits, const at::Tensor& target, double scale) {
  TORCH_CHECK(softmax_xent_kernel_applies(logits), "softmax_xent_grad_: logits must be a contiguous 2-D float32 CPU tensor");
  const int64_t n = logits.size(0);
  const int64_t v = logits.size(1);
  const auto t = target.to(at::kLong).contiguous();
  TORCH_CHECK(t.dim() == 1 && t.size(0) == n, "softmax_xent_grad_: target must be [", n, "], got ", t.sizes());
  const int64_t* tp = t.const_data_ptr<int64_t>();
  for (int64_t r = 0; r < n; ++r)
    if (tp[r] < 0 || tp[r] >= v)
      throw DataError("LM loss: target " + std::to_string(tp[r]) + " at row " + std::to_string(r) +
                       " is outside the vocabulary [0, " + std::to_string(v) + ")");
  RECORD_FUNCTION("lt::softmax_xent_grad_", std::vector<c10::IValue>({logits}));
  float* x = logits.mutable_data_ptr<float>();
  std::vector<double> row_loss(n);
  const auto k = static_cast<float>(scale);
  at::parallel_for(0, n, std::max<int64_t>(1, kGrain / v), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) row_loss[r] = xent_row(x + r * v, v, tp[r], k);
  });
  double total = 0.0;
  for (const double l : row_loss) total += l;
  return total;
}

}  // namespace lt::recompute
