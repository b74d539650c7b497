// ResNet: stems, BasicBlock, Bottleneck and the network.
#include <torch/torch.h>

#include "leantrain/models/resnet.h"
#include "leantrain/models/batch_norm_relu.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/recompute/packed_activation.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {

// The recompute layer's pieces (in_backward, dropout, packed inputs, the LM losses).
using namespace lt::recompute;

namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

std::string join(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

}  // namespace

std::pair<std::vector<int64_t>, std::string> resnet_layout(const lt::models::ModelConfig& c) {
  if (c.depth == 0) {
    if (c.layers.empty()) {
      throw lt::ConfigError(
          "model.layers = []: with model.depth = 0 give the blocks per stage, e.g. [2, 2, 2, 2]");
    }
    for (int64_t n : c.layers) {
      if (n < 1) {
        throw lt::ConfigError("model.layers = " + join(c.layers) +
                              ": every stage needs >= 1 block");
      }
    }
    if (c.block != "basic" && c.block != "bottleneck") {
      throw lt::ConfigError("model.block = \"" + c.block +
                            "\": must be \"basic\" or \"bottleneck\"");
    }
    return {c.layers, c.block};
  }
  if (!c.layers.empty()) {
    throw lt::ConfigError("model.layers = " + join(c.layers) + ": set model.depth = 0 to use "
                          "model.layers (model.depth = " + std::to_string(c.depth) + ")");
  }
  switch (c.depth) {
    case 18: return {{2, 2, 2, 2}, "basic"};
    case 34: return {{3, 4, 6, 3}, "basic"};
    case 50: return {{3, 4, 6, 3}, "bottleneck"};
    case 101: return {{3, 4, 23, 3}, "bottleneck"};
    case 152: return {{3, 8, 36, 3}, "bottleneck"};
    default:
      throw lt::ConfigError("model.depth = " + std::to_string(c.depth) +
                            ": must be 18, 34, 50, 101 or 152, or 0 with model.layers");
  }
}

DownsampleImpl::DownsampleImpl(int64_t in, int64_t out, int64_t stride) {
  conv = register_module("conv", lt::models::conv(in, out, 1, stride, 0));
  bn = register_module("bn", torch::nn::BatchNorm2d(out));
}

torch::Tensor DownsampleImpl::forward(const torch::Tensor& x) { return bn(recompute::conv2d(*conv, x, conv_products)); }

BasicBlockImpl::BasicBlockImpl(int64_t in, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv(in, planes, 3, stride, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  if (stride != 1 || in != planes * kExpansion) {
    down = register_module("down", std::make_shared<DownsampleImpl>(in, planes * kExpansion,
                                                                    stride));
  }
}

torch::Tensor ResidualBlockImpl::forward(const torch::Tensor& x) {
  if (!split_recompute_ || !is_training() || !torch::GradMode::is_enabled()) {
    // In place, as torchvision's `out += identity; relu(inplace=True)`: the branch's last
    // BatchNorm saves its input, not its output, and the sum is saved by nothing, so neither
    // needs a tensor of its own (the same values as out of place, bitwise).
    auto y = branch(x);
    const auto shortcut = down ? down->forward(x) : x;
    if (y.scalar_type() != shortcut.scalar_type() || y.sizes() != shortcut.sizes()) return torch::relu(y + shortcut);
    return y.add_(shortcut).relu_();
  }
  // Note [ResNet recompute units]: same ops in the same order as above, so bitwise equal.
  std::vector<torch::Tensor> params;
  const auto modules = branch_modules();
  for (auto* m : modules) {
    auto p = m->parameters();
    params.insert(params.end(), p.begin(), p.end());
  }
  const std::vector<torch::nn::Module*> down_modules{down.get()};
  if (!packed_input_) {
    auto y = in_backward([this](const std::vector<torch::Tensor>& in) { return branch(in[0]); }, {x}, params, modules);
    auto shortcut =
        down ? in_backward([this](const std::vector<torch::Tensor>& in) { return down->forward(in[0]); }, {x},
                          down->parameters(), down_modules)
             : x;
    return torch::relu(y + shortcut);
  }
  // Note [Packed block inputs]: both units keep x as one packed copy, and the ReLU keeps a
  // bit mask, so nothing holds x itself once the next block has run.
  const auto packed = pack_tensor(x);
  const ConvUnit branch_unit{&first_conv(), [this](const std::vector<torch::Tensor>& in) { return branch_middle(in[0]); },
                             &last_bn(), conv_products_};
  auto y = in_backward(branch_unit, x, packed, params, modules);
  torch::Tensor shortcut = x;
  if (down) {
    const ConvUnit down_unit{down->conv.get(), [](const std::vector<torch::Tensor>& in) { return in[0]; }, down->bn.get(),
                             conv_products_};
    shortcut = in_backward(down_unit, x, packed, down->parameters(), down_modules);
  }
  return mask_relu(y + shortcut);
}

torch::Tensor BasicBlockImpl::branch_middle(const torch::Tensor& h) {
  return recompute::conv2d(*conv2, bn_relu(*bn1, h, fused_bn_relu_), conv_products_);
}

std::vector<torch::nn::Module*> BasicBlockImpl::branch_modules() {
  return {conv1.get(), bn1.get(), conv2.get(), bn2.get()};
}

BottleneckImpl::BottleneckImpl(int64_t in, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv(in, planes, 1, 1, 0));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, stride, 1));
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  conv3 = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, 0));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
  if (stride != 1 || in != planes * kExpansion) {
    down = register_module("down", std::make_shared<DownsampleImpl>(in, planes * kExpansion,
                                                                    stride));
  }
}

torch::Tensor BottleneckImpl::branch_middle(const torch::Tensor& h) {
  auto y = bn_relu(*bn1, h, fused_bn_relu_);
  y = bn_relu(*bn2, recompute::conv2d(*conv2, y, conv_products_), fused_bn_relu_);
  return recompute::conv2d(*conv3, y, conv_products_);
}

std::vector<torch::nn::Module*> BottleneckImpl::branch_modules() {
  return {conv1.get(), bn1.get(), conv2.get(), bn2.get(), conv3.get(), bn3.get()};
}

ResNetStemImpl::ResNetStemImpl(int64_t in_channels, int64_t width, const std::string& kind)
    : pool_(kind == "imagenet") {
  conv = register_module("conv", pool_ ? lt::models::conv(in_channels, width, 7, 2, 3)
                                       : lt::models::conv(in_channels, width, 3, 1, 1));
  bn = register_module("bn", torch::nn::BatchNorm2d(width));
}

torch::Tensor ResNetStemImpl::forward(const torch::Tensor& x) {
  auto y = bn_relu(*bn, recompute::conv2d(*conv, x, conv_products), fused_bn_relu);
  if (pool_) y = torch::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  return y;
}

ResNet::ResNet(const lt::models::ModelConfig& cfg) {
  auto [layers, block] = resnet_layout(cfg);
  stage_blocks_ = layers;
  const bool bottleneck = block == "bottleneck";
  const int64_t expansion = bottleneck ? BottleneckImpl::kExpansion : BasicBlockImpl::kExpansion;
  stem = register_module("stem",
                         std::make_shared<ResNetStemImpl>(cfg.in_channels, cfg.width, cfg.stem));
  int64_t in = cfg.width;
  for (size_t s = 0; s < layers.size(); ++s) {
    const int64_t planes = cfg.width << s;
    for (int64_t j = 0; j < layers[s]; ++j) {
      const int64_t stride = (s > 0 && j == 0) ? 2 : 1;
      if (bottleneck) {
        add_block("blocks", std::make_shared<BottleneckImpl>(in, planes, stride));
      } else {
        add_block("blocks", std::make_shared<BasicBlockImpl>(in, planes, stride));
      }
      in = planes * expansion;
    }
  }
  fc = register_module("fc", torch::nn::Linear(in, cfg.num_classes));
  // Note [Fused BatchNorm and ReLU] (batch_norm_relu.cpp): the stem's pair and each branch's
  // inner pairs; the block's last BatchNorm is followed by the sum, not a ReLU.
  const bool fused = cfg.bn_relu == "fused";
  stem->fused_bn_relu = fused;
  for (auto& b : blocks()) static_cast<ResidualBlockImpl&>(*b).set_fused_bn_relu(fused);
  set_conv_products(recompute::HeadMatmul::kAuto);

  // torchvision init: kaiming normal (fan_out, relu) convs, BN weight 1 bias 0.
  torch::NoGradGuard no_grad;
  for (auto& mod : modules(/*include_self=*/false)) {
    if (auto* c = mod->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = mod->as<torch::nn::BatchNorm2d>()) {
      b->weight.fill_(1.0);
      b->bias.zero_();
    }
  }
  // Note [Channels-last ResNet]
  // With model.memory_format = "channels_last" (the default) the 4-D weights, and so every
  // activation and gradient of the convolution stack, lie in memory as NHWC. oneDNN (and
  // cuDNN) run convolutions natively in that layout; given NCHW, oneDNN's backward copies the
  // input and the output gradient into its blocked layout first: 37 MiB of transient copies
  // in one 1x1 convolution's backward at [8, 256, 56, 56]. Measured on ResNet-50 (bench/
  // precision_memory.cpp, 2-core Xeon with AMX): bf16 steps 0.41 s instead of 0.61 s, fp32
  // 0.95 s instead of 1.07 s. The logical tensors are the same, so checkpoints (written as
  // contiguous NCHW values) load into either layout, and the gradients an all-reduce or the
  // optimizer sees have their parameter's layout (autograd's gradient layout contract).
  // oneDNN's channels-last kernels sum in another order than its NCHW ones, so the two
  // layouts agree to rounding, not bitwise; each agrees bitwise with PyTorch running the
  // same layout (tests/python/test_against_cpp.py checks both). Fashion-MNIST ResNet (the
  // demo's model): 2299 samples/s against 1944 in NCHW.
  if (cfg.memory_format == "channels_last") {
    channels_last_ = true;
    for (auto& p : parameters())
      // As PyTorch's Module.to(memory_format=...) does it: Tensor.to also restrides a weight
      // whose NCHW strides already pass as channels-last (one input channel), which
      // .contiguous() would keep; oneDNN picks its kernels by those strides.
      if (p.dim() == 4) p.set_data(p.to(p.options(), false, false, at::MemoryFormat::ChannelsLast));
  }
}

void ResNet::set_conv_products(recompute::HeadMatmul m) {
  stem->conv_products = m;
  for (auto& b : blocks()) static_cast<ResidualBlockImpl&>(*b).set_conv_products(m);
}

std::string ResNet::compute_note(const c10::Device& device, c10::ScalarType dtype) const {
  // Said only where the convolutions' products leave the autocast dtype.
  const auto m = stem->conv_products;  // every convolution's (set_conv_products)
  if (dtype != torch::kBFloat16 || !recompute::head_products_in_fp32(m, dtype, device.type())) return "";
  return std::string("convolutions as fp32 products of bf16-rounded operands") +
         (m == recompute::HeadMatmul::kAuto ? " (precision.conv_products = auto: x86 CPU without AMX-BF16)"
                                                         : "");
}

void ResNet::set_recompute_units(ResNetRecomputeUnits units) {
  size_t end = 0;
  for (auto [b, e] : units.segments) {
    TORCH_CHECK(b >= end && e > b && e <= blocks().size(), "ResNet recompute segment [", b, ", ", e,
                ") of ", blocks().size(), " blocks: segments must be sorted, disjoint and non-empty");
    end = e;
  }
  for (auto& b : blocks()) static_cast<ResidualBlockImpl&>(*b).set_split_recompute(false);
  for (size_t i : units.split) {
    TORCH_CHECK(i < blocks().size(), "ResNet split recompute block ", i, " of ", blocks().size());
    for (auto [b, e] : units.segments)
      TORCH_CHECK(i < b || i >= e, "ResNet block ", i, " is both split and in segment [", b, ", ", e, ")");
    static_cast<ResidualBlockImpl&>(*blocks()[i]).set_split_recompute(true, units.packed);
  }
  units_ = std::move(units);
}

namespace {

// Note [ResNet recompute units]
// Recomputing whole blocks leaves ResNet-50 at 0.46x of its activations (micro-batch 8, fp32):
// the 112x112 stem is not recomputed (~70 MB), and while a block's rerun is differentiated
// the unit's backward holds the gradient of the block output and the rerun's output
// (for a 56x56x256 block, 2 x 25.7 MB) on top of the rerun's own activations. So:
//  - the stem (conv, BN, ReLU, max-pool) is a unit of its own: only the image is kept;
//  - a block is split into two units, the residual branch (convs and BNs up to the sum) and
//    the downsample shortcut, with the sum and the final ReLU outside them. Under `full`
//    the ReLU keeps one bit per element (mask_relu), and both units keep the block input
//    packed, as its nonzero values and those bits (Note [Packed block inputs], Note [Shared
//    ReLU bits]), which each unit's first convolution rebuilds in the rerun (Note [Packed
//    input kept through the rerun]); under `selective` the ReLU's saved output is the block
//    input they keep; the ReLU's backward runs before the rerun and frees the block's output
//    gradient; and the sum and ReLU are not recomputed. The same ops run in the same order as the plain
//    block, so fp32 gradients stay bitwise equal.
//  - a rerun's output is let go before its graph is differentiated (Note [Rerun gradients]):
//    neither a BatchNorm nor the sum saves it.
// Coarser units (segments of several blocks, as torch.utils.checkpoint_sequential) were
// measured and are worse here: each saves one input less but its rerun holds several blocks'
// activations while the inputs of all earlier units are still kept (docs/BENCH_PRECISION_MEMORY.md).
// Nothing is recomputed twice: a unit's rerun runs the plain modules, never another recomputed unit.
// `full` splits every block but the last; `selective` recomputes the stem and the first stage, whose
// 56x56 activations are half of the network's for about a fifth of its forward time.
ResNetRecomputeUnits resnet_units(const ResNet& net, const RecomputePolicy& policy) {
  ResNetRecomputeUnits u;
  const size_t count = net.blocks().size();
  if (policy.kind == RecomputePolicy::Kind::kFull) {
    // The blocks the policy recomputes: all but the last (Note [The last block is not
    // recomputed], recompute.cpp).
    for (size_t i = 0; i < count; ++i)
      if (policy.recomputes_block(i, count)) u.split.push_back(i);
  } else if (policy.kind == RecomputePolicy::Kind::kSelective) {
    for (size_t i = 0; i < static_cast<size_t>(net.stage_blocks().front()); ++i) u.split.push_back(i);
  } else {
    return u;
  }
  u.stem = true;
  // Packing costs a pass over each block input in forward and two in backward: `full`, which
  // is there for the least memory, pays it; `selective`, which is there to stay fast, does not.
  u.packed = policy.kind == RecomputePolicy::Kind::kFull;
  return u;
}

}  // namespace

void ResNet::apply_recompute(const RecomputePolicy& policy) {
  // full and selective: Note [ResNet recompute units]; none and every:K: the default (whole
  // blocks through the block runner).
  auto units = resnet_units(*this, policy);
  const bool own_units = units.stem;
  set_recompute_units(std::move(units));
  if (own_units) {
    set_block_runner({});
    return;
  }
  Model::apply_recompute(policy);
}

torch::Tensor ResNet::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "ResNet: expected images [B,C,H,W], got ", input.sizes());
  // in_backward() itself runs plainly without grad mode; outside training the units are off
  // so evaluation never pays for the bookkeeping.
  const bool units = is_training();
  torch::Tensor x;
  // Tensor.to (not .contiguous(), which keeps NCHW strides that pass as channels-last when
  // there is one channel): the same strides whatever the loader made, as the reference model.
  const auto image = channels_last_ ? input.to(input.options(), false, false, at::MemoryFormat::ChannelsLast) : input;
  if (units && units_.stem) {
    x = in_backward([this](const std::vector<torch::Tensor>& in) { return stem->forward(in[0]); }, {image},
                   stem->parameters(), std::vector<torch::nn::Module*>{stem.get()});
  } else {
    x = stem->forward(image);
  }
  size_t next = 0;  // the next segment that can start
  for (size_t i = 0; i < blocks().size();) {
    if (units && next < units_.segments.size() && units_.segments[next].first == i) {
      const auto [b, e] = units_.segments[next++];
      std::vector<torch::Tensor> params;
      std::vector<torch::nn::Module*> modules;
      for (size_t j = b; j < e; ++j) {
        auto p = blocks()[j]->parameters();
        params.insert(params.end(), p.begin(), p.end());
        modules.push_back(blocks()[j].get());
      }
      // The blocks run directly, not through the block runner: a unit is recomputed once.
      x = in_backward(
          [this, b = b, e = e](const std::vector<torch::Tensor>& in) {
            auto h = in[0];
            for (size_t j = b; j < e; ++j) h = blocks()[j]->forward(h);
            return h;
          },
          {x}, params, modules);
      i = e;
    } else {
      x = run_block(i++, x);
    }
  }
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

}  // namespace lt::models
