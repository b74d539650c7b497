// A 2-D convolution's geometry, kept on a custom Function's context from forward to backward:
// the convolutions of conv_products.cpp and packed_activation.cpp, which differentiate with
// at::convolution_backward themselves.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <tuple>
#include <vector>

namespace lt::recompute::detail {

struct ConvGeometry {
  std::vector<int64_t> bias_sizes;  // empty without a bias
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["bias_sizes"] = bias_sizes;
    ctx->saved_data["stride"] = stride;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["dilation"] = dilation;
    ctx->saved_data["groups"] = groups;
  }

  static ConvGeometry load(torch::autograd::AutogradContext* ctx) {
    return {ctx->saved_data["bias_sizes"].toIntVector(), ctx->saved_data["stride"].toIntVector(),
            ctx->saved_data["padding"].toIntVector(), ctx->saved_data["dilation"].toIntVector(),
            ctx->saved_data["groups"].toInt()};
  }

  /// at::convolution_backward with this geometry, for the gradients the Function's inputs
  /// need: input 0 the convolution's input, 1 its weight, 2 its bias (when it has one).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(torch::autograd::AutogradContext* ctx, const at::Tensor& g,
                                                          const at::Tensor& x, const at::Tensor& w) const {
    std::optional<at::IntArrayRef> bias_opt;
    if (!bias_sizes.empty()) bias_opt = at::IntArrayRef(bias_sizes);
    return at::convolution_backward(
        g, x, w, bias_opt, stride, padding, dilation, /*transposed=*/false, std::vector<int64_t>(stride.size(), 0),
        groups, {ctx->needs_input_grad(0), ctx->needs_input_grad(1), !bias_sizes.empty() && ctx->needs_input_grad(2)});
  }
};

}  // namespace lt::recompute::detail
