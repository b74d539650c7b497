// CPU kernels for two ops whose ATen CPU kernels are slow on the training step's shapes: the
// tanh GELU (forward and backward) and the LM loss's softmax rows. Note [CPU kernels for the
// tanh GELU and the loss's softmax] (recompute/src/cpu_kernels.cpp).
#pragma once

#include <torch/torch.h>

#include <string>

namespace lt::recompute {

/// Whether gelu / gelu_backward run this library's kernel for x: approximate "tanh", x a CPU
/// tensor of float32 or bfloat16. Otherwise they run at::gelu / at::gelu_backward.
bool gelu_kernel_applies(const at::Tensor& x, const std::string& approximate);

/// at::gelu(x, approximate) without autograd (a tensor of x's dtype and shape).
at::Tensor gelu(const at::Tensor& x, const std::string& approximate);

/// at::gelu_backward(grad, x, approximate): grad * gelu'(x), in x's dtype.
at::Tensor gelu_backward(const at::Tensor& grad, const at::Tensor& x, const std::string& approximate);

/// torch::gelu(x, approximate) with autograd: forward gelu, backward gelu_backward (x saved,
/// as GeluBackward0 saves it). What the transformers' MLPs call.
at::Tensor gelu_autograd(const at::Tensor& x, const std::string& approximate);

/// Whether softmax_xent_grad_ runs in place on `logits`: a contiguous 2-D float32 CPU tensor.
bool softmax_xent_kernel_applies(const at::Tensor& logits);

/// For logits [n, V] (softmax_xent_kernel_applies) and target [n] (int64 class indices in
/// [0, V)): writes (softmax(logits) - onehot(target)) * scale over the logits, row by row,
/// and returns the sum over rows of -log softmax(logits)[target] (a double). A NaN in a row
/// makes the sum NaN.
double softmax_xent_grad_(at::Tensor& logits, const at::Tensor& target, double scale);

}  // namespace lt::recompute
