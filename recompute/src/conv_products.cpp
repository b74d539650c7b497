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
// first convolutions and the one that keeps its input packed — so checkpointed runs stay
// bitwise equal to plain ones.

bool conv_products_in_fp32(HeadMatmul choice, c10::DeviceType device) {
  if (!at::autocast::is_autocast_enabled(device) || at::autocast::get_autocast_dtype(device) != at::kBFloat16)
    return false;
  return head_products_in_fp32(choice, torch::kBFloat16, device);
}

at::Tensor rounded_fp32(const at::Tensor& t) {
  return t.scalar_type() == torch::kBFloat16 ? t.to(torch::kFloat) : t.to(torch::kBFloat16).to(torch::kFloat);
}

at::Tensor conv2d_fp32_products(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                int64_t groups) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const auto b = bias.defined() ? rounded_fp32(bias) : at::Tensor();
  return at::conv2d(rounded_fp32(x), rounded_fp32(weight), b, stride, padding, dilation, groups)
      .to(torch::kBFloat16);
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Fp32ProductsConv : torch::autograd::Function<Fp32ProductsConv> {
  // x: bf16 (cast by the caller, as autocast casts it); params: the weight, and the bias if any.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList params,
                            std::vector<int64_t> stride, std::vector<int64_t> padding, std::vector<int64_t> dilation,
                            int64_t groups) {
    const at::Tensor bias = params.size() > 1 ? params[1] : at::Tensor();
    auto out = conv2d_fp32_products(x, params[0], bias, stride, padding, dilation, groups);
    ctx->save_for_backward({x, params[0]});
    detail::ConvGeometry{bias.defined() ? bias.sizes().vec() : std::vector<int64_t>{}, std::move(stride),
                         std::move(padding), std::move(dilation), groups}
        .save(ctx);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    const auto saved = ctx->get_saved_variables();
    const auto geometry = detail::ConvGeometry::load(ctx);
    auto [gx, gw, gb] =
        geometry.backward(ctx, grad_out[0].to(torch::kFloat), rounded_fp32(saved[0]), rounded_fp32(saved[1]));
    if (gx.defined()) gx = gx.to(saved[0].scalar_type());
    if (gw.defined()) gw = gw.to(saved[1].scalar_type());
    variable_list grads{gx, gw};
    if (!geometry.bias_sizes.empty()) grads.push_back(gb.defined() ? gb.to(saved[1].scalar_type()) : gb);
    grads.resize(grads.size() + 4);  // stride, padding, dilation, groups
    return grads;
  }
};

}  // namespace

at::Tensor conv2d(torch::nn::Conv2dImpl& conv, const at::Tensor& x, HeadMatmul choice) {
  const auto& o = conv.options;
  const auto* padding = std::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (!conv_products_in_fp32(choice, x.device().type()) || padding == nullptr ||
      !std::holds_alternative<torch::enumtype::kZeros>(o.padding_mode()) || o.transposed() ||
      !at::isFloatingType(x.scalar_type()) || conv.weight.scalar_type() != torch::kFloat)
    return conv.forward(x);
  std::vector<at::Tensor> params{conv.weight};
  if (conv.bias.defined()) params.push_back(conv.bias);
  return Fp32ProductsConv::apply(x.to(torch::kBFloat16), at::TensorList(params), at::IntArrayRef(o.stride()).vec(),
                                 at::IntArrayRef(*padding).vec(), at::IntArrayRef(o.dilation()).vec(), o.groups());
}

}  // namespace lt::recompute
