// ResNet: stems, BasicBlock, Bottleneck and the network.
#include <torch/torch.h>

#include "leantrain/models/resnet.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {

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

std::pair<std::vector<int64_t>, std::string> resnet_layout(const lt::ModelConfig& c) {
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

torch::Tensor DownsampleImpl::forward(const torch::Tensor& x) { return bn(conv(x)); }

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

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = bn2(conv2(y));
  return torch::relu(y + (down ? down->forward(x) : x));
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

torch::Tensor BottleneckImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn1(conv1(x)));
  y = torch::relu(bn2(conv2(y)));
  y = bn3(conv3(y));
  return torch::relu(y + (down ? down->forward(x) : x));
}

ResNetStemImpl::ResNetStemImpl(int64_t in_channels, int64_t width, const std::string& kind)
    : pool_(kind == "imagenet") {
  conv = register_module("conv", pool_ ? lt::models::conv(in_channels, width, 7, 2, 3)
                                       : lt::models::conv(in_channels, width, 3, 1, 1));
  bn = register_module("bn", torch::nn::BatchNorm2d(width));
}

torch::Tensor ResNetStemImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(bn(conv(x)));
  if (pool_) y = torch::max_pool2d(y, {3, 3}, {2, 2}, {1, 1});
  return y;
}

ResNet::ResNet(const lt::ModelConfig& cfg) {
  auto [layers, block] = resnet_layout(cfg);
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
}

torch::Tensor ResNet::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() == 4, "ResNet: expected images [B,C,H,W], got ", input.sizes());
  auto x = stem->forward(input);
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

}  // namespace lt::models
