#pragma once
// The model interface every trainer sees: a Model is a torch::nn::Module with a forward over a
// batch, a task (which loss applies), and the list of its repeated blocks (the unit of
// activation checkpointing). build_model() turns a ModelConfig into one of the concrete models
// (gpt.h, bert.h, resnet.h, mlp.h).
//
// Naming: every model keeps its repeated blocks in a torch::nn::ModuleList registered as
// `blocks`, so block parameters are named `blocks.<i>.<...>` in named_parameters(), in forward
// order. The per-model names are listed at the top of each model header.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "leantrain/runtime/config.h"

namespace lt::models {

enum class Task { kClassify, kCausalLM, kMaskedLM };

/// "classify" | "causal_lm" | "masked_lm".
const char* task_name(Task task);

/// A repeated unit of a model (transformer layer, residual block): Tensor -> Tensor.
class BlockImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

/// Runs block i on x. The trainer installs one to checkpoint activations (a later issue).
using BlockRunner =
    std::function<torch::Tensor(size_t index, BlockImpl& block, const torch::Tensor& x)>;

class Model : public torch::nn::Module {
 public:
  /// input: token ids int64 [B,T] (gpt, bert) or images float [B,C,H,W] (resnet, mlp).
  /// Returns logits: [B,T,V] for LMs, [B,num_classes] for classifiers.
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  virtual Task task() const = 0;
  /// The mean training loss of a batch (compute_loss on forward()'s logits in fp32).
  /// Language models override it so that the [B,T,V] logits never exist at once: in
  /// training, the head fused with its cross-entropy in chunks of tokens (Note [Fused LM
  /// loss] in lm_loss.cpp) unless set_fused_loss(false) or autocast is fp16; then, when
  /// set_loss_chunk_tokens() asks for it, the head and cross-entropy in checkpointed chunks
  /// (Note [Chunked LM loss] in activation_checkpoint.cpp); else the plain loss.
  virtual torch::Tensor forward_loss(const torch::Tensor& input, const torch::Tensor& target);
  /// Checkpointed chunks: 0: plain loss; n > 0: chunks of n tokens; -1: chunks sized so one
  /// chunk's fp32 logits take about 64 MiB. n > 0 also sets the fused loss's chunk.
  void set_loss_chunk_tokens(int64_t n) { loss_chunk_tokens_ = n; }
  /// The fused head + loss (on by default; off: the paths above, e.g. to compare with them).
  void set_fused_loss(bool on) { fused_loss_ = on; }

  /// The repeated blocks in forward order (the unit of activation checkpointing).
  const std::vector<std::shared_ptr<BlockImpl>>& blocks() const { return blocks_; }
  /// Installs the function that runs each block; an empty runner calls block->forward(x).
  void set_block_runner(BlockRunner runner) { runner_ = std::move(runner); }

 protected:
  /// Appends `b` to the torch::nn::ModuleList registered under `name` (registered on first use,
  /// so its place among the model's children is where the first block is added; LibTorch
  /// forbids dots in names, hence the list) and to blocks(). Its parameters are then named
  /// `<name>.<index in that list>.<...>`. All models use name = "blocks".
  template <class B>
  std::shared_ptr<B> add_block(const std::string& name, std::shared_ptr<B> b) {
    static_assert(std::is_base_of<BlockImpl, B>::value, "add_block needs a BlockImpl");
    block_list(name)->push_back(b);
    blocks_.push_back(b);
    return b;
  }
  /// Runs block i on x, through the runner when one is set.
  torch::Tensor run_block(size_t i, const torch::Tensor& x);
  /// Tokens per loss chunk for a head of `vocab` outputs, 0 when the loss is not chunked
  /// (not requested, not training, or no autograd).
  int64_t loss_chunk_tokens(int64_t vocab) const;
  /// Tokens per fused-loss chunk when forward_loss uses the fused head + loss on a batch on
  /// `device`, 0 when it does not (off, not training, no autograd, or fp16 autocast).
  int64_t fused_loss_chunk_tokens(int64_t vocab, c10::DeviceType device) const;

 private:
  torch::nn::ModuleList block_list(const std::string& name);

  std::vector<std::shared_ptr<BlockImpl>> blocks_;
  std::map<std::string, torch::nn::ModuleList> block_lists_;
  BlockRunner runner_;
  int64_t loss_chunk_tokens_ = 0;
  bool fused_loss_ = true;
};

/// Builds the model cfg.kind names (gpt | bert | resnet | mlp), initialised as documented in
/// its header, on the CPU in fp32. Throws lt::ConfigError naming model.<key> for an impossible
/// value (unknown kind, d_model not divisible by n_head, a ResNet depth outside
/// {18,34,50,101,152} while layers is empty, a non-positive size, ...).
std::shared_ptr<Model> build_model(const lt::ModelConfig& cfg);

/// Throws lt::ConfigError naming model.<key> if build_model(cfg) would; does not allocate.
void check_model_config(const lt::ModelConfig& cfg);

/// Number of unique parameter elements (a tied weight counts once).
int64_t count_parameters(const torch::nn::Module& m);

/// Loss for a batch: mean cross-entropy. kClassify: logits [B,K], target int64 [B].
/// kCausalLM/kMaskedLM: logits [B,T,V] are flattened to [B*T,V], target int64 [B,T] with
/// -100 marking positions that do not count (ignore_index). The causal-LM target is the input
/// already shifted by the data layer (target[t] = input[t+1]).
torch::Tensor compute_loss(Task task, const torch::Tensor& logits, const torch::Tensor& target);

/// The ignore_index of compute_loss for language-model targets.
constexpr int64_t kIgnoreIndex = -100;

}  // namespace lt::models
