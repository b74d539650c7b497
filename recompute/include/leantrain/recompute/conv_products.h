// Convolutions under bf16 autocast on CPUs whose bf16 kernels are slow: Note [Convolutions in
// fp32 where bf16 is slow] (recompute/src/conv_products.cpp).
#pragma once

#include <torch/nn/modules/conv.h>

#include "leantrain/recompute/lm_loss.h"

namespace lt::recompute {

/// Whether a convolution on `device` runs its products as fp32 convolutions of the
/// bf16-rounded operands under the current autocast state: autocast on that device in bf16,
/// and `choice` fp32, or auto on an x86 CPU without AMX-BF16 (the rule of the fused head's
/// products, head_products_in_fp32; precision.conv_products).
bool conv_products_in_fp32(HeadMatmul choice, c10::DeviceType device);

/// conv.forward(x), or, when conv_runs_as_gemm, the same as GEMMs; or, when
/// conv_products_in_fp32(choice, x's device) and the convolution pads explicitly with zeros,
/// the same convolution with fp32 products (as GEMMs where conv_runs_as_gemm): x rounded to bf16 as
/// autocast rounds it, the output bf16 as autocast's; the input gradient bf16, the weight's
/// and bias's fp32 (not rounded through bf16 first).
at::Tensor conv2d(torch::nn::Conv2dImpl& conv, const at::Tensor& x, HeadMatmul choice);

/// Whether conv2d runs `conv` on x (bf16 when fp32_products) as GEMMs: a training 1x1
/// convolution where ATen would run its single-threaded THNN kernel (Note [1x1 convolutions
/// as GEMMs], conv_products.cpp). The convolution that keeps its input packed asks too.
bool conv_runs_as_gemm(const torch::nn::Conv2dImpl& conv, const at::Tensor& x, bool fp32_products);

/// The operands a convolution with fp32 products runs and differentiates with: t rounded to
/// bf16 and widened.
at::Tensor rounded_fp32(const at::Tensor& t);

}  // namespace lt::recompute
