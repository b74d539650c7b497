#pragma once
// The recompute layer, below the models: activation recompute for LibTorch C++, which has no
// torch.utils.checkpoint (pytorch issue #52744). A function runs without keeping its
// intermediate activations and is recomputed in backward (in_backward; Note [Activation
// recompute] in recompute.cpp), with the pieces that make that cheap: dropout masks
// kept as bits, packed block inputs (packed_activation.h), chunked and fused LM losses
// (lm_loss.h), and the memory.recompute policy. Nothing here knows a model: models/ says what
// to recompute (Model::apply_recompute). In leantrain's names "checkpoint" means a state file.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>

#include "leantrain/recompute/lm_loss.h"
#include "leantrain/recompute/packed_activation.h"

namespace lt::recompute {

/// A function of tensors that can be recomputed in backward (see in_backward for what it must
/// obey: the same path twice, dropout through lt::recompute::dropout).
using RecomputeFn = std::function<torch::Tensor(const std::vector<torch::Tensor>& inputs)>;

/// Returns fn(inputs) with autograd history but without fn's saved activations; backward
/// reruns fn with the RNG state (CPU and CUDA) and autocast state of this call, then
/// differentiates that rerun with respect to `inputs` and `params` (the parameters fn
/// reads: they must be passed so their gradients flow). `buffers_of`, when given, has its
/// buffers (BatchNorm running statistics) restored after the rerun, so they are updated once.
/// Outside grad mode it is just fn(inputs). When the backward that differentiates it is a
/// plain backward(), the parameters' gradients are added to their .grad as soon as the rerun
/// computes them (Note [Rerun gradients]): pass each parameter to one recomputed function, or
/// the order of that addition can differ from the plain graph's by rounding.
torch::Tensor in_backward(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params,
                         torch::nn::Module* buffers_of = nullptr);
/// The same with the buffers of several modules restored (a segment of blocks), and, when
/// `rerun` is given, backward runs rerun(inputs) instead of fn(inputs): a function that builds
/// the graph fn builds (the same saved tensors, hence the same gradients) but whose output's
/// values are never read, since backward only differentiates it, so it may leave them
/// uncomputed (Note [A unit's last product is not rerun], models/src/transformer.cpp).
torch::Tensor in_backward(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params,
                         const std::vector<torch::nn::Module*>& buffers_of, RecomputeFn rerun = {});
/// What a training BatchNorm module's forward does before it normalises, for code that runs
/// its kernels without the module: counts the batch (num_batches_tracked += 1) and returns
/// the running statistics' update factor (the momentum; 1 / num_batches_tracked without one).
double count_batch(torch::nn::BatchNorm2dImpl& bn);

/// A unit that begins with a convolution and ends with a BatchNorm: last(middle({first(x)})).
struct ConvUnit {
  torch::nn::Conv2dImpl* first = nullptr;
  RecomputeFn middle;
  torch::nn::BatchNorm2dImpl* last = nullptr;
  // How first's products run under bf16 autocast (conv_products.h): as the model's other
  // convolutions, so the unit computes what the plain block computes.
  HeadMatmul conv_products = HeadMatmul::kAutocast;
};
/// A ConvUnit, recomputed in backward, with x kept packed (`packed` = pack_tensor(x)) instead of whole
/// (Note [Packed block inputs]): the rerun rebuilds x only inside first's forward, and
/// first's backward rebuilds it again (Note [Packed input kept through the rerun]); the rerun
/// does not compute last's output (Note [A unit's last BatchNorm is not rerun]). Units that
/// share an input share its packed tensors. `params` are first's, middle's and last's.
torch::Tensor in_backward(const ConvUnit& unit, const torch::Tensor& x, const PackedTensor& packed,
                         const std::vector<torch::Tensor>& params, const std::vector<torch::nn::Module*>& buffers_of);

/// Whether this thread is running a recomputed function's rerun in backward: what that rerun
/// builds lives only until its own backward, right after, so memory-saving tricks inside it
/// (GeluLinear's, Note [GELU recomputed in the MLP's backward]) buy nothing there.
bool rerunning();

/// torch::dropout(x, p, train), bitwise, except inside a recomputed function on the CPU:
/// there the mask is kept as one bit per element, and the rerun applies it instead of
/// drawing it again (Note [Dropout masks kept as bits]).
torch::Tensor dropout(const torch::Tensor& x, double p, bool train);

/// Mean cross-entropy of head(hidden) against target (ignore_index -100), computed in
/// recomputed chunks of `chunk_tokens` tokens: only one chunk's logits exist at a time,
/// in forward and in backward. `params` are the head's parameters.
torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& target,
                              const std::vector<torch::Tensor>& params,
                              const std::function<torch::Tensor(const torch::Tensor&)>& head,
                              int64_t chunk_tokens);

/// A recompute policy parsed from memory.recompute.
struct RecomputePolicy {
  enum class Kind { kNone, kFull, kEvery, kSelective } kind = Kind::kNone;
  int64_t every = 1;  // kEvery: recompute blocks 0, K, 2K, ...

  /// "none" | "full" | "every:K" | "selective". Throws ConfigError naming
  /// memory.recompute otherwise ("auto" is resolved by the planner).
  static RecomputePolicy parse(const std::string& text);
  /// Whether models::Model::apply_recompute's default recomputes registered block `index` of
  /// `count` whole: full: every block but the last; every:K: index % K == 0, the last
  /// excepted; none and selective: none (selective recomputes only the regions a model marks
  /// cheap). Note [The last block is not recomputed] in recompute.cpp.
  bool recomputes_block(size_t index, size_t count) const;
  std::string to_string() const;
};
}  // namespace lt::recompute
