#pragma once
// The options of the built-in model kinds (gpt, bert, resnet, mlp) as one plain struct. The
// registry binds each kind's table of options to the members that kind reads
// (models/src/registry.cpp), so a member's initializer here is that option's default.
// Torch-free.
#include <cstdint>
#include <string>
#include <vector>

namespace lt::models {

struct ModelConfig {
  std::string kind = "mlp";  // gpt | bert | resnet | mlp
  // Transformers (gpt, bert).
  int64_t vocab_size = 257;
  int64_t seq_len = 128;     // context length = learned positions
  int64_t n_layer = 2;
  int64_t n_head = 2;
  int64_t d_model = 64;
  int64_t d_ff = 0;          // 0 means 4 * d_model
  int64_t type_vocab_size = 2;  // bert token types
  double dropout = 0.0;
  // sdpa: at::scaled_dot_product_attention (LibTorch picks flash / memory-efficient / cuDNN /
  // math); plain: softmax(QK^T)V with the [B,H,T,T] probabilities materialised (attention.h).
  std::string attention = "sdpa";
  // ResNet.
  int64_t depth = 18;                 // 18 | 34 | 50 | 101 | 152, or 0 with layers + block
  std::vector<int64_t> layers;        // blocks per stage when depth = 0
  std::string block = "basic";        // basic | bottleneck (depth = 0 only)
  int64_t width = 64;                 // channels of the first stage
  std::string stem = "imagenet";      // imagenet (7x7/2 + maxpool) | small (3x3/1, for 28x28)
  std::string memory_format = "channels_last";  // channels_last | contiguous (resnet's convolutions)
  // fused: each BatchNorm followed by a ReLU runs as one op where it can (batch_norm_relu.h);
  // separate: the two ATen ops.
  std::string bn_relu = "fused";
  // Images (resnet, mlp).
  int64_t in_channels = 1;
  int64_t image_size = 28;
  int64_t num_classes = 10;
  // MLP.
  std::vector<int64_t> hidden = {256, 256};
};

}  // namespace lt::models
