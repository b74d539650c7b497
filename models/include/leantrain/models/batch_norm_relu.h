// relu(batch_norm(x)) in one pass each way: Note [Fused BatchNorm and ReLU] (models/src/batch_norm_relu.cpp).
#pragma once

#include <torch/nn/modules/batchnorm.h>

namespace lt::models {

/// Whether bn_relu(bn, x, true) runs the fused kernels: x a float32 4-D CPU tensor in
/// channels-last layout (dense), with more than one value per channel; the module in training,
/// affine, tracking running statistics. Otherwise bn_relu runs the module, then torch::relu.
bool bn_relu_fuses(const torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x);

/// torch::relu(bn(x)), the module's running statistics and num_batches_tracked updated as its
/// forward updates them; fused (Note [Fused BatchNorm and ReLU]) when `fused` and
/// bn_relu_fuses(bn, x).
torch::Tensor bn_relu(torch::nn::BatchNorm2dImpl& bn, const torch::Tensor& x, bool fused);

}  // namespace lt::models
