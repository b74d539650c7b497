#pragma once
// Activation recompute for LibTorch C++, which has no torch.utils.checkpoint (pytorch
// issue #52744): a function runs without keeping its intermediate activations and is
// recomputed in backward. See Note [Activation checkpoint recompute] in the .cpp. (The file
// and checkpoint() keep the PyTorch name; elsewhere "checkpoint" means a state file.)
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>

#include "leantrain/models/model.h"
#include "leantrain/models/packed_activation.h"

namespace lt::models {

/// Returns fn(inputs) with autograd history but without fn's saved activations; backward
/// reruns fn with the RNG state (CPU and CUDA) and autocast state of this call, then
/// differentiates that rerun with respect to `inputs` and `params` (the parameters fn
/// reads: they must be passed so their gradients flow). `buffers_of`, when given, has its
/// buffers (BatchNorm running statistics) restored after the rerun, so they are updated once.
/// Outside grad mode it is just fn(inputs). When the backward that differentiates it is a
/// plain backward(), the parameters' gradients are added to their .grad as soon as the rerun
/// computes them (Note [Rerun gradients]): pass each parameter to one checkpoint, or the
/// order of that addition can differ from the uncheckpointed graph's by rounding.
torch::Tensor checkpoint(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params,
                         torch::nn::Module* buffers_of = nullptr);
/// The same with the buffers of several modules restored (a segment of blocks).
torch::Tensor checkpoint(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params,
                         const std::vector<torch::nn::Module*>& buffers_of);
/// A unit that begins with a convolution and ends with a BatchNorm: last(middle({first(x)})).
struct ConvUnit {
  torch::nn::Conv2dImpl* first = nullptr;
  RecomputeFn middle;
  torch::nn::BatchNorm2dImpl* last = nullptr;
};
/// A ConvUnit, checkpointed, with x kept packed (`packed` = pack_tensor(x)) instead of whole
/// (Note [Packed block inputs]): the rerun rebuilds x only inside first's forward, and
/// first's backward rebuilds it again (Note [Packed input kept through the rerun]); the rerun
/// does not compute last's output (Note [A unit's last BatchNorm is not rerun]). Units that
/// share an input share its packed tensors. `params` are first's, middle's and last's.
torch::Tensor checkpoint(const ConvUnit& unit, const torch::Tensor& x, const PackedTensor& packed,
                         const std::vector<torch::Tensor>& params, const std::vector<torch::nn::Module*>& buffers_of);

/// torch::dropout(x, p, train), bitwise, except inside a checkpointed function on the CPU:
/// there the mask is kept as one bit per element, and the rerun applies it instead of
/// drawing it again (Note [Dropout masks kept as bits]).
torch::Tensor dropout(const torch::Tensor& x, double p, bool train);

/// Mean cross-entropy of head(hidden) against target (ignore_index -100), computed in
/// checkpointed chunks of `chunk_tokens` tokens: only one chunk's logits exist at a time,
/// in forward and in backward. `params` are the head's parameters.
torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& target,
                              const std::vector<torch::Tensor>& params,
                              const std::function<torch::Tensor(const torch::Tensor&)>& head,
                              int64_t chunk_tokens);

/// A recompute policy parsed from memory.recompute (alias memory.activation_checkpoint).
struct RecomputePolicy {
  enum class Kind { kNone, kFull, kEvery, kSelective } kind = Kind::kNone;
  int64_t every = 1;  // kEvery: recompute blocks 0, K, 2K, ...

  /// "none" | "full" | "every:K" | "selective". Throws ConfigError naming
  /// memory.recompute otherwise ("auto" is resolved by the planner).
  static RecomputePolicy parse(const std::string& text);
  /// Whether the default Model::apply_recompute recomputes registered block `index` whole:
  /// full: every block; every:K: index % K == 0; none and selective: none (selective
  /// recomputes only the regions a model marks cheap).
  bool checkpoints_block(size_t index) const;
  std::string to_string() const;
};
/// The former name, kept for callers.
using CheckpointPolicy = RecomputePolicy;

/// Installs the policy on a model: model.apply_recompute(policy) (model.h says what the
/// default recomputes under each policy; GPT and BERT mark their attention cores cheap, so
/// selective recomputes those — Megatron-LM's selective recompute; ResNet overrides it:
/// full recomputes the stem and every block's residual branch and shortcut as separate
/// units, selective the stem and the first stage's blocks the same way, every:K whole
/// blocks, Note [ResNet checkpoint units] in resnet.cpp; MLP keeps the default, so
/// selective recomputes nothing there).
void apply_checkpoint_policy(Model& model, const RecomputePolicy& policy);

}  // namespace lt::models
