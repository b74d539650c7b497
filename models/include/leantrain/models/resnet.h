#pragma once
// ResNet (He et al. 2015, torchvision v1.5 layout: the stride of a bottleneck is on its 3x3
// conv). Task kClassify. depth 18/34: BasicBlock [2,2,2,2]/[3,4,6,3]; 50/101/152: Bottleneck
// [3,4,6,3]/[3,4,23,3]/[3,8,36,3]; depth 0: cfg.layers blocks per stage with cfg.block.
// Stage s has planes = width * 2^s; its first block has stride 2 when s > 0. A BasicBlock
// outputs planes channels, a Bottleneck planes * 4.
//
// Parameter names (named_parameters()), blocks numbered 0.. across all stages in forward order:
//   stem.conv.weight  [W,C,7,7] (imagenet: stride 2, pad 3) or [W,C,3,3] (small: stride 1,
//                     pad 1); no bias. Imagenet also max-pools 3x3/2 pad 1 (no parameters).
//   stem.bn.weight/bias [W]
//   blocks.i.conv1.weight, blocks.i.bn1.weight/bias, blocks.i.conv2.weight, blocks.i.bn2.*,
//   (Bottleneck) blocks.i.conv3.weight, blocks.i.bn3.*
//   (when the shape changes) blocks.i.down.conv.weight [out,in,1,1], blocks.i.down.bn.*
//   fc.weight [num_classes, channels of the last stage], fc.bias [num_classes]
// Buffers (named_buffers()): every `<bn>.running_mean`, `<bn>.running_var`,
// `<bn>.num_batches_tracked`. Convs have no bias.
//   BasicBlock: conv1 3x3/stride, conv2 3x3/1. Bottleneck: conv1 1x1, conv2 3x3/stride,
//   conv3 1x1 (x4). Each conv is followed by its BN; ReLU after bn1, bn2 (basic: after the
//   sum), and after the residual sum.
// Forward: images [B,C,H,W] float -> stem -> blocks -> global average pool -> fc [B,K].
// Init as torchvision: kaiming normal (fan_out, relu) for convs, BN weight 1 bias 0, fc keeps
// the default nn.Linear init.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>

#include "leantrain/models/model.h"
#include "leantrain/recompute/conv_products.h"

namespace lt::models {

/// 1x1 conv + BN on the shortcut when the block changes stride or channels.
class DownsampleImpl : public torch::nn::Module {
 public:
  DownsampleImpl(int64_t in, int64_t out, int64_t stride);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  recompute::HeadMatmul conv_products = recompute::HeadMatmul::kAuto;  // precision.conv_products
};

/// A residual block whose residual branch and shortcut can be recomputed as two units with
/// the sum and final ReLU outside them (Note [ResNet recompute units] in resnet.cpp).
class ResidualBlockImpl : public BlockImpl {
 public:
  torch::Tensor forward(const torch::Tensor& x) override;
  /// The convs and BNs before the sum, without the shortcut:
  /// last_bn(branch_middle(first_conv(x))).
  torch::Tensor branch(const torch::Tensor& x) {
    return last_bn().forward(branch_middle(recompute::conv2d(first_conv(), x, conv_products_)));
  }
  /// The branch's first convolution, what follows it up to its last BatchNorm, and that BatchNorm.
  virtual torch::nn::Conv2dImpl& first_conv() = 0;
  virtual torch::Tensor branch_middle(const torch::Tensor& h) = 0;
  virtual torch::nn::BatchNorm2dImpl& last_bn() = 0;
  /// The modules branch() runs (their parameters and buffers are the unit's).
  virtual std::vector<torch::nn::Module*> branch_modules() = 0;
  /// On: in training with autograd, branch and shortcut are recomputed units of their own.
  /// `packed`: the units keep the block input packed and the final ReLU keeps bits (Note
  /// [Packed block inputs]); otherwise they keep it whole, as the ReLU's saved output.
  void set_split_recompute(bool on, bool packed = false) {
    split_recompute_ = on;
    packed_input_ = on && packed;
  }
  bool split_recompute() const { return split_recompute_; }
  bool packed_input() const { return packed_input_; }
  /// model.bn_relu = "fused": the branch's BatchNorm + ReLU pairs through bn_relu (batch_norm_relu.h).
  void set_fused_bn_relu(bool on) { fused_bn_relu_ = on; }
  /// precision.conv_products for the block's convolutions, the shortcut's included (conv_products.h).
  void set_conv_products(recompute::HeadMatmul m) {
    conv_products_ = m;
    if (down) down->conv_products = m;
  }

  std::shared_ptr<DownsampleImpl> down;  // null when the shortcut is the identity

 protected:
  bool fused_bn_relu_ = false;
  recompute::HeadMatmul conv_products_ = recompute::HeadMatmul::kAuto;

 private:
  bool split_recompute_ = false;
  bool packed_input_ = false;
};

class BasicBlockImpl : public ResidualBlockImpl {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in, int64_t planes, int64_t stride);
  torch::nn::Conv2dImpl& first_conv() override { return *conv1; }
  torch::Tensor branch_middle(const torch::Tensor& h) override;
  torch::nn::BatchNorm2dImpl& last_bn() override { return *bn2; }
  std::vector<torch::nn::Module*> branch_modules() override;

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::BatchNorm2d bn2{nullptr};
};

class BottleneckImpl : public ResidualBlockImpl {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in, int64_t planes, int64_t stride);
  torch::nn::Conv2dImpl& first_conv() override { return *conv1; }
  torch::Tensor branch_middle(const torch::Tensor& h) override;
  torch::nn::BatchNorm2dImpl& last_bn() override { return *bn3; }
  std::vector<torch::nn::Module*> branch_modules() override;

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::Conv2d conv2{nullptr};
  torch::nn::BatchNorm2d bn2{nullptr};
  torch::nn::Conv2d conv3{nullptr};
  torch::nn::BatchNorm2d bn3{nullptr};
};

class ResNetStemImpl : public torch::nn::Module {
 public:
  /// kind: "imagenet" (7x7/2 conv, BN, ReLU, 3x3/2 max-pool) or "small" (3x3/1 conv, BN, ReLU).
  ResNetStemImpl(int64_t in_channels, int64_t width, const std::string& kind);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  bool fused_bn_relu = false;  // model.bn_relu = "fused" (batch_norm_relu.h)
  recompute::HeadMatmul conv_products = recompute::HeadMatmul::kAuto;  // precision.conv_products

 private:
  bool pool_;
};

/// What ResNet::forward recomputes in backward (training with autograd on), installed by
/// apply_recompute: the stem as one unit, and block ranges [begin, end) each as one
/// unit, and blocks whose branch and shortcut are units of their own (split; the sum and
/// ReLU stay outside) (Note [ResNet recompute units] in resnet.cpp). Blocks
/// in no segment go through the block runner.
struct ResNetRecomputeUnits {
  bool stem = false;
  std::vector<std::pair<size_t, size_t>> segments;  // sorted, disjoint, non-empty
  std::vector<size_t> split;                         // blocks in no segment
  bool packed = false;  // split blocks keep their inputs packed (Note [Packed block inputs])
};

class ResNet : public Model {
 public:
  explicit ResNet(const lt::models::ModelConfig& cfg);
  torch::Tensor forward(const torch::Tensor& input) override;
  Task task() const override { return Task::kClassify; }
  /// Its own units (Note [ResNet recompute units] in resnet.cpp): full recomputes the stem
  /// and every block's residual branch and shortcut as separate units, keeping block inputs
  /// packed; selective the stem and the first stage's blocks the same way, unpacked; none and
  /// every:K are the default's (every:K: whole blocks 0, K, 2K, ...).
  void apply_recompute(const RecomputePolicy& policy) override;
  /// Every convolution's (Note [Convolutions in fp32 where bf16 is slow], conv_products.cpp).
  void set_conv_products(recompute::HeadMatmul m) override;
  std::string compute_note(const c10::Device& device, c10::ScalarType dtype) const override;

  /// Blocks per stage (resnet_layout's first element).
  const std::vector<int64_t>& stage_blocks() const { return stage_blocks_; }
  void set_recompute_units(ResNetRecomputeUnits units);
  const ResNetRecomputeUnits& recompute_units() const { return units_; }

  std::shared_ptr<ResNetStemImpl> stem;
  torch::nn::Linear fc{nullptr};

 private:
  std::vector<int64_t> stage_blocks_;
  ResNetRecomputeUnits units_;
  bool channels_last_ = false;
};

/// Blocks per stage and block kind ("basic" | "bottleneck") for cfg (depth or layers+block).
/// Throws lt::ConfigError naming model.depth / model.layers / model.block.
std::pair<std::vector<int64_t>, std::string> resnet_layout(const lt::models::ModelConfig& cfg);

}  // namespace lt::models
