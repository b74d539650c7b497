// A 2-D convolution's geometry, kept on a custom Function's context from forward to backward:
// the convolutions of conv_products.cpp and packed_activation.cpp, which run and differentiate
// the convolution themselves (at::conv2d and at::convolution_backward, or as GEMMs).
#pragma once

#include <torch/torch.h>

#include <array>
#include <optional>
#include <tuple>
#include <vector>

namespace lt::recompute::detail {

/// Whether a training convolution of x by w runs as GEMMs (Note [1x1 convolutions as GEMMs],
/// conv_products.cpp): a 1x1 kernel, unstrided, unpadded, undilated, one group, x a 4-D
/// channels-last CPU tensor, a batch below 16 and one thread — where ATen runs its THNN
/// kernel — and an fp32 weight with either fp32 products (x bf16, widened) or an fp32 x that
/// autocast leaves alone.
bool gemm_conv_applies(const at::Tensor& x, const at::Tensor& w, at::IntArrayRef stride, at::IntArrayRef padding,
                       at::IntArrayRef dilation, int64_t groups, bool fp32_products, bool training);

/// The convolution as one GEMM ([N H W, C] x [C, O] into a channels-last output), + bias.
at::Tensor gemm_conv_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias);

/// gemm_conv_forward's gradients, for mask = {input, weight, bias}.
std::tuple<at::Tensor, at::Tensor, at::Tensor> gemm_conv_backward(const at::Tensor& g, const at::Tensor& x,
                                                                  const at::Tensor& w, std::array<bool, 3> mask);

struct ConvGeometry {
  std::vector<int64_t> bias_sizes;  // empty without a bias
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  bool gemm = false;  // forward ran gemm_conv_forward

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["bias_sizes"] = bias_sizes;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["gemm"] = gemm;
  }

  static ConvGeometry load(torch::autograd::AutogradContext* ctx) {
    return {ctx->saved_data["bias_sizes"].toIntVector(), ctx->saved_data["stride"].toIntVector(),
            ctx->saved_data["padding"].toIntVector(),    ctx->saved_data["dilation"].toIntVector(),
            ctx->saved_data["groups"].toInt(),           ctx->saved_data["gemm"].toBool()};
  }

  /// The convolution's forward: gemm_conv_forward when `gemm`, else at::conv2d; with
  /// fp32_products, of the bf16-rounded operands widened to fp32, the output rounded to bf16
  /// (Note [Convolutions in fp32 where bf16 is slow], conv_products.cpp).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias, bool fp32_products) const;

  /// at::convolution_backward with this geometry (gemm_conv_backward when `gemm`), for the
  /// gradients the Function's inputs need: input 0 the convolution's input, 1 its weight, 2
  /// its bias (when it has one).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(torch::autograd::AutogradContext* ctx, const at::Tensor& g,
                                                          const at::Tensor& x, const at::Tensor& w) const {
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1),
                                   !bias_sizes.empty() && ctx->needs_input_grad(2)};
    if (gemm) return gemm_conv_backward(g, x, w, mask);
    std::optional<at::IntArrayRef> bias_opt;
    if (!bias_sizes.empty()) bias_opt = at::IntArrayRef(bias_sizes);
    return at::convolution_backward(g, x, w, bias_opt, stride, padding, dilation, /*transposed=*/false,
                                    std::vector<int64_t>(stride.size(), 0), groups, mask);
  }
};

}  // namespace lt::recompute::detail
