#include "leantrain/recompute/conv_products.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/torch.h>

#include "conv_geometry.h"

namespace lt::recompute {

// Note [Convolutions in fp32 where bf16 is slow]
// On an x86 CPU without AMX, oneDNN's bf16 convolutions (AVX512-BF16 dot products) run
// slower than its fp32 ones, as its bf16 GEMMs do (Note [Head products in fp32 where bf16
// GEMMs are slow], lm_loss.cpp). ResNet-50's convolutions at micro-batch 8 on 2 threads of the
// Xeon these benchmarks ran on, forward + backward (input and weight gradients), one
// convolution each (bench/conv_products.py):
// 64->64 3x3 at 56x56 38.4 ms in bf16 against 37.1 ms in fp32 including the widening copies;
// 128->128 3x3 at 28x28 36.7 against 23.8; 256->256 3x3 at 14x14 36.5 against 25.5; 512->512
// 3x3 at 7x7 39.7 against 26.7; the 1x1s 18-19 against 14-18: over the eight shapes 224.7 ms
// against 176.6. Convolutions are 81 % of a bf16 ResNet-50 step here, so under
// precision.conv_products = auto (the default) they run there as fp32 convolutions of the
// operands autocast would give a bf16 one: the input and the weight rounded to bf16, then
// widened; the output rounded to bf16, as the bf16 convolution's (which accumulates in fp32
// too). The activations stay bf16 (what is saved is the bf16 input), so memory is bf16's but
// for the fp32 copies of one convolution's input and output while it runs. Backward widens
// the bf16 output gradient and input and differentiates in fp32: the input gradient is
// rounded to bf16 once, as autocast's is; the weight gradient reaches the fp32 weight without
// the bf16 rounding autocast's cast backward adds (at least as accurate). On CUDA and on CPUs
// with AMX-BF16 convolutions stay bf16; `autocast` keeps them bf16 everywhere, `fp32` forces
// this path (tests). Every ResNet convolution goes through it — the plain blocks, the units'
// first convolutions and the one that keeps its input packed — so recomputed runs stay
// bitwise equal to plain ones.

bool conv_products_in_fp32(HeadMatmul choice, c10::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device) || at::autocast::get_autocast_dtype(device) != at::kBFloat16)
    return false;
  return head_products_in_fp32(choice, torch::kBFloat16, device);
}

at::Tensor rounded_fp32(const at::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.to(torch::kFloat) : t.to(torch::kBFloat16).to(torch::kFloat);
}

at::Tensor detail::ConvGeometry::forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                                         bool fp32_products) const {
  const auto run = [&](const at::Tensor& x, const at::Tensor& w, const at::Tensor& b) {
    return gemm ? gemm_conv_forward(x, w, b) : at::conv2d(x, w, b, stride, padding, dilation, groups);
  };
  if (!fp32_products) return run(x, w, bias);
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  return run(rounded_fp32(x), rounded_fp32(w), bias.defined() ? rounded_fp32(bias) : at::Tensor())
      .to(torch::kBFloat16);
}

// Note [1x1 convolutions as GEMMs]
// With one thread and a batch below 16, ATen 2.x runs an unstrided 1x1 fp32 convolution with
// its THNN kernel (_slow_conv2d_forward / _backward: "THNN is faster when single-threaded"),
// which for a channels-last input works in NCHW: copies in, zero-fills, copies out. That is
// what every rank of a CPU run with one thread per rank gets (the 2-rank rows of
// bench/peers), and ResNet-50 has 36 such convolutions (a bottleneck's conv1 and conv3, and
// the first stage's shortcut): in a 1-thread fp32 step at micro-batch 8 (224x224) they took
// 765 ms of 2.27 s (leantrain_bench_profile), with ~100 ms more in copy_ and fill_. For a
// channels-last x [N, C, H, W] such a convolution is one GEMM: [N H W, C] x [C, O] written
// straight into the channels-last output; backward is two ([N H W, O] x [O, C] for the input
// gradient, [O, N H W] x [N H W, C] for the weight's). Measured per convolution, forward +
// backward, 1 thread, over ResNet-50's twelve 1x1 shapes: 380 ms as ATen runs them, 318 ms as
// GEMMs; a whole 1-thread step (reference_models.py's ResNet-50) 2.04-2.17 s against
// 1.95-1.97 s. With more threads ATen runs oneDNN, which is as fast or faster at 56x56, so
// this is only where ATen takes its THNN path (detail::gemm_conv_applies), and only in
// training (evaluation runs ATen's kernels, which the reference comparisons hold bitwise).
// Every path that runs a ResNet convolution (the plain blocks through OwnConv, the fp32
// products, the units' first convolutions, the one that keeps its input packed) makes the
// same choice with the same calls, so recomputed runs stay bitwise equal to plain ones.

namespace detail {

bool gemm_conv_applies(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride, at::IntArrayRef padding,
                       at::IntArrayRef dilation, int64_t groups, bool fp32_products, bool training) {
  if (w.scalar_type() != torch::kFloat ||
      (!fp32_products &&
       (x.scalar_type() != torch::kFloat || at::autocast::is_autocast_enabled(x.device().type()))))
    return false;
  auto all = [](at::IntArrayRef v, int64_t value) {
    for (const auto e : v)
      if (e != value) return false;
    return true;
  };
  return training && at::get_num_threads() == 1 && x.device().is_cpu() && x.dim() == 4 && w.dim() == 4 &&
         w.size(2) == 1 && w.size(3) == 1 && groups == 1 && all(stride, 1) && all(padding, 0) && all(dilation, 1) &&
         x.size(0) < 16 && x.size(1) == w.size(1) && x.is_contiguous(at::MemoryFormat::ChannelsLast);
}

namespace {
// [N, C, H, W] channels-last -> its [N H W, C] rows (a view).
at::Tensor rows(const at::Tensor& t) { return t.permute({0, 2, 3, 1}).reshape({-1, t.size(1)}); }
}  // namespace

at::Tensor gemm_conv_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  const int64_t o = w.size(0);
  auto y = at::empty({x.size(0), o, x.size(2), x.size(3)}, x.options().memory_format(at::MemoryFormat::ChannelsLast));
  auto y2 = rows(y);
  const auto w2t = w.reshape({o, w.size(1)}).t();
  if (bias.defined()) at::addmm_out(y2, bias, rows(x), w2t);
  else at::mm_out(y2, rows(x), w2t);
  return y;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gemm_conv_backward(const at::Tensor& g, const at::Tensor& x,
                                                                  const at::Tensor& w, std::array<bool, 3> mask) {
  const int64_t o = w.size(0), c = w.size(1);
  const auto g2 = rows(g.contiguous(at::MemoryFormat::ChannelsLast));
  at::Tensor gx, gw, gb;
  if (mask[0]) {
    gx = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::ChannelsLast));
    auto gx2 = rows(gx);
    at::mm_out(gx2, g2, w.reshape({o, c}));
  }
  if (mask[1]) gw = at::mm(g2.t(), rows(x.contiguous(at::MemoryFormat::ChannelsLast))).view(w.sizes());
  if (mask[2]) gb = g2.sum(0);
  return {gx, gw, gb};
}

}  // namespace detail

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A convolution this library runs and differentiates itself: with fp32 products (Note
// [Convolutions in fp32 where bf16 is slow]: x bf16, cast by the caller as autocast casts it),
// or as GEMMs (Note [1x1 convolutions as GEMMs]: x fp32), or both. params: the weight, and the
// bias if any.
struct OwnConv : torch::autograd::Function<OwnConv> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                            int64_t groups, bool fp32_products, bool gemm) {
    const at::Tensor bias = params.size() > 1 ? params[1] : at::Tensor();
    detail::ConvGeometry geometry{bias.defined() ? bias.sizes().vec() : std::vector<int64_t>{}, std::move(stride),
                                  std::move(padding), std::move(dilation), groups, gemm};
    auto out = geometry.forward(x, params[0], bias, fp32_products);
    ctx->save_for_backward({x, params[0]});
    ctx->saved_data["fp32_products"] = fp32_products;
    geometry.save(ctx);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto geometry = detail::ConvGeometry::load(ctx);
    const bool fp32_products = ctx->saved_data["fp32_products"].toBool();
    auto [gx, gw, gb] =
        fp32_products
            ? geometry.backward(ctx, grad_out[0].to(torch::kFloat), rounded_fp32(saved[0]), rounded_fp32(saved[1]))
            : geometry.backward(ctx, grad_out[0], saved[0], saved[1]);
    if (gx.defined()) gx = gx.to(saved[0].scalar_type());
    if (gw.defined()) gw = gw.to(saved[1].scalar_type());
    variable_list grads{gx, gw};
    if (!geometry.bias_sizes.empty()) grads.push_back(gb.defined() ? gb.to(saved[1].scalar_type()) : gb);
    grads.resize(grads.size() + 6);  // stride, padding, dilation, groups, fp32_products, gemm
    return grads;
  }
};

}  // namespace

at::Tensor conv2d(torch::nn::Conv2dImpl& conv, const at::Tensor& x, HeadMatmul choice) {
  const auto& o = conv.options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (padding == nullptr || !std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()) || o.transposed() ||
      !at::isFloatingType(x.scalar_type()) || conv.weight.scalar_type() != torch::kFloat)
    return conv.forward(x);
  const bool fp32_products = conv_products_in_fp32(choice, x.device().type());
  const auto xr = fp32_products ? x.to(torch::kBFloat16) : x;
  const bool gemm = conv_runs_as_gemm(conv, xr, fp32_products);
  if (!fp32_products && !gemm) return conv.forward(x);
  std::vector<at::Tensor> params{conv.weight};
  if (conv.bias.defined()) params.push_back(conv.bias);
  return OwnConv::apply(xr, at::TensorList(params), at::IntArrayRef(o.stride()).vec(), at::IntArrayRef(*padding).vec(),
                        at::IntArrayRef(o.dilation()).vec(), o.groups(), fp32_products, gemm);
}

bool conv_runs_as_gemm(const torch::nn::Conv2dImpl& conv, const at::Tensor& x, bool fp32_products) {
  const auto& o = conv.options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  return padding != nullptr && !o.transposed() &&
         detail::gemm_conv_applies(x, conv.weight, o.stride(), *padding, o.dilation(), o.groups(), fp32_products,
                                   conv.is_training());
}

}  // namespace lt::recompute
