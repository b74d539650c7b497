#pragma once
// The model interface every trainer sees: a Model is a torch::nn::Module with a forward over a
// batch, a task (which loss applies), the list of its repeated blocks (the unit of activation
// recompute), the regions it marks cheap to recompute, and apply_recompute (what it recomputes
// under each memory.recompute policy). build_model() turns a ModelConfig into one of the
// concrete models (gpt.h, bert.h, resnet.h, mlp.h).
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
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>

#include "leantrain/models/model_config.h"
#include "leantrain/recompute/lm_loss.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/contract.h"

namespace lt::models {

enum class Task { kClassify, kCausalLM, kMaskedLM };

/// Named tensors beside a batch's main input (InputContract::fields).
using TensorMap = std::map<std::string, torch::Tensor>;

/// "classify" | "causal_lm" | "masked_lm".
const char* task_name(Task task);

/// A repeated unit of a model (transformer layer, residual block): Tensor -> Tensor.
class BlockImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  /// forward(x) as a recomputed block's rerun runs it (recompute::in_backward's `rerun`): the same
  /// graph, so the same gradients, but the output's values may be left uncomputed, since the
  /// rerun only differentiates them (Note [A unit's last product is not rerun]). By default,
  /// forward(x).
  virtual torch::Tensor forward_for_gradients(const torch::Tensor& x) { return forward(x); }
};

/// Runs block i on x. apply_recompute installs one that recomputes blocks in backward.
using BlockRunner =
    std::function<torch::Tensor(size_t index, BlockImpl& block, const torch::Tensor& x)>;

/// The recompute layer's function type and policy (recompute/recompute.h), as models name them.
using recompute::RecomputeFn;
using recompute::RecomputePolicy;

/// A region of a forward that is cheap to recompute but keeps large activations for backward
/// (the attention core: its [B,H,T,T] scores and probabilities for a few FLOPs). The module
/// that computes it keeps one CheapRegion and runs the region through run(); the model marks
/// it with Model::mark_cheap. Under the `selective` policy a marked region is recomputed in
/// backward (run() is then recompute::in_backward(fn, inputs, params), bitwise the same values and
/// gradients); under every other policy, or while unmarked, run() is fn(inputs). Copies share
/// one switch, so the copy the model keeps turns the module's on and off.
class CheapRegion {
 public:
  /// fn(inputs), or, when recompute is on, the same recomputed in backward. `params`: the
  /// parameters fn reads (their gradients flow only when passed; none for the attention core).
  torch::Tensor run(const RecomputeFn& fn, const std::vector<torch::Tensor>& inputs,
                    const std::vector<torch::Tensor>& params = {}) const;
  /// Whether run() recomputes (set by apply_recompute on the model that marked it).
  bool recompute() const { return *on_; }
  void set_recompute(bool on) { *on_ = on; }

 private:
  std::shared_ptr<bool> on_ = std::make_shared<bool>(false);
};

class Model : public torch::nn::Module {
 public:
  /// input: token ids int64 [B,T] (gpt, bert) or images float [B,C,H,W] (resnet, mlp).
  /// Returns logits: [B,T,V] for LMs, [B,num_classes] for classifiers.
  virtual torch::Tensor forward(const torch::Tensor& input) = 0;
  virtual Task task() const = 0;
  /// The mean training loss of a batch (compute_loss on forward()'s logits in fp32).
  /// Language models override it so that the [B,T,V] logits never exist at once: in
  /// training, the head fused with its cross-entropy in chunks of tokens (Note [Fused LM
  /// loss] in recompute/src/lm_loss.cpp) unless set_fused_loss(false) or autocast is fp16; then, when
  /// set_loss_chunk_tokens() asks for it, the head and cross-entropy in recomputed chunks
  /// (Note [Chunked LM loss] in recompute/src/recompute.cpp); else the plain loss.
  virtual torch::Tensor forward_loss(const torch::Tensor& input, const torch::Tensor& target);
  /// forward / forward_loss with the named inputs a model's InputContract::fields lists
  /// (Batch::fields, on the model's device). The trainer calls these; the defaults ignore the
  /// fields, so a model that declares fields overrides both.
  virtual torch::Tensor forward_with(const torch::Tensor& input, const TensorMap& fields);
  virtual torch::Tensor forward_loss_with(const torch::Tensor& input, const torch::Tensor& target,
                                          const TensorMap& fields);
  /// Recomputed chunks: 0: plain loss; n > 0: chunks of n tokens; -1: chunks sized so one
  /// chunk's fp32 logits take about 64 MiB. n > 0 also sets the fused loss's chunk.
  void set_loss_chunk_tokens(int64_t n) { loss_chunk_tokens_ = n; }
  /// The fused head + loss (on by default; off: the paths above, e.g. to compare with them).
  void set_fused_loss(bool on) { fused_loss_ = on; }
  /// How the fused head's products run under bf16 (precision.head_matmul; lm_loss.h).
  void set_head_matmul(recompute::HeadMatmul m) { head_matmul_ = m; }
  /// How its convolutions' products run under bf16 (precision.conv_products; conv_products.h):
  /// a model with convolutions overrides this; the default has none and ignores it.
  virtual void set_conv_products(recompute::HeadMatmul /*m*/) {}
  recompute::HeadMatmul head_matmul() const { return head_matmul_; }

  /// The repeated blocks in forward order (the unit of whole-block recompute).
  const std::vector<std::shared_ptr<BlockImpl>>& blocks() const { return blocks_; }
  /// Installs the function that runs each block; an empty runner calls block->forward(x).
  void set_block_runner(BlockRunner runner) { runner_ = std::move(runner); }

  /// Installs what this model recomputes in backward under `policy` (memory.recompute),
  /// replacing what an earlier call installed. The default, for any model:
  ///  - none: nothing is recomputed;
  ///  - full / every:K: the blocks registered with add_block (all of them / blocks 0, K,
  ///    2K, ...; never the last, which backward reruns first: Note [The last block is not
  ///    recomputed]) are recomputed whole, in training with autograd on, through the block
  ///    runner; language models also compute their head + loss in recomputed chunks
  ///    (set_loss_chunk_tokens(-1); Note [Chunked LM loss] in recompute/src/recompute.cpp);
  ///  - selective: only the regions marked with mark_cheap are recomputed (GPT and BERT
  ///    mark their attention cores). A model that marks none recomputes nothing under
  ///    selective: it trains as under none.
  /// A model with other units overrides it (ResNet: its stem and split residual blocks, Note
  /// [ResNet recompute units] in resnet.cpp). Values and gradients are bitwise the same
  /// under every policy; only the memory kept for backward and the time differ.
  virtual void apply_recompute(const RecomputePolicy& policy);
  /// The names given to mark_cheap, in marking order.
  std::vector<std::string> cheap_region_names() const;
  /// How this model computes where it trains on `device` with activations of `dtype` (the
  /// autocast dtype, else fp32), for the startup log; empty when there is nothing to say (the
  /// default). GPT and BERT name the attention kernel LibTorch picks (attention.h,
  /// attention_backend).
  virtual std::string compute_note(const c10::Device& device, c10::ScalarType dtype) const;

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
  /// Marks `region` (kept by one of this model's modules) as cheap to recompute: the default
  /// apply_recompute turns its recompute on under `selective` and off otherwise. `name`
  /// says where it is, e.g. "blocks.3.attn.core". Mark in the constructor.
  void mark_cheap(const std::string& name, const CheapRegion& region);
  /// Tokens per loss chunk for a head of `vocab` outputs, 0 when the loss is not chunked
  /// (not requested, not training, or no autograd).
  int64_t loss_chunk_tokens(int64_t vocab) const;
  /// Tokens per fused-loss chunk when forward_loss uses the fused head + loss on a batch on
  /// `device`, 0 when it does not (off, not training, no autograd, or fp16 autocast); for a
  /// [vocab, dim] head (fused_lm_loss_chunk_tokens unless set_loss_chunk_tokens(n > 0)).
  int64_t fused_loss_chunk_tokens(int64_t vocab, int64_t dim, c10::DeviceType device) const;

 private:
  torch::nn::ModuleList block_list(const std::string& name);

  std::vector<std::shared_ptr<BlockImpl>> blocks_;
  std::map<std::string, torch::nn::ModuleList> block_lists_;
  BlockRunner runner_;
  std::vector<std::pair<std::string, CheapRegion>> cheap_regions_;
  int64_t loss_chunk_tokens_ = 0;
  bool fused_loss_ = true;
  recompute::HeadMatmul head_matmul_ = recompute::HeadMatmul::kAuto;
};

/// Builds the built-in model cfg.kind names (gpt | bert | resnet | mlp), initialised as
/// documented in its header, on the CPU in fp32, through the model registry (registry.h):
/// the options of cfg.kind are checked against its table first. Throws lt::ConfigError
/// naming model.<key> for an impossible value (unknown kind, d_model not divisible by n_head,
/// a ResNet depth outside {18,34,50,101,152} while layers is empty, a non-positive size, ...).
std::shared_ptr<Model> build_model(const lt::models::ModelConfig& cfg);

/// Throws lt::ConfigError naming model.<key> if build_model(cfg) would; does not allocate.
/// (The same checks as the registry's resolve_model: one table per kind.)
void check_model_config(const lt::models::ModelConfig& cfg);

/// Number of unique parameter elements (a tied weight counts once).
int64_t count_parameters(const torch::nn::Module& m);

/// Loss for a batch: mean cross-entropy. kClassify: logits [B,K], target int64 [B].
/// kCausalLM/kMaskedLM: logits [B,T,V] are flattened to [B*T,V], target int64 [B,T] with
/// -100 marking positions that do not count (ignore_index). The causal-LM target is the input
/// already shifted by the data layer (target[t] = input[t+1]).
torch::Tensor compute_loss(Task task, const torch::Tensor& logits, const torch::Tensor& target);

/// The ignore_index of compute_loss for language-model targets.
constexpr int64_t kIgnoreIndex = recompute::kIgnoreIndex;

/// Installs the policy on a model: model.apply_recompute(policy) (what the default recomputes
/// under each policy is said there; GPT and BERT mark their attention cores cheap, so
/// selective recomputes those — Megatron-LM's selective recompute; ResNet overrides it: full
/// recomputes the stem and every block's residual branch and shortcut as separate units,
/// selective the stem and the first stage's blocks the same way, every:K whole blocks, Note
/// [ResNet recompute units] in resnet.cpp; MLP keeps the default, so selective recomputes
/// nothing there).
void apply_recompute_policy(Model& model, const RecomputePolicy& policy);

}  // namespace lt::models
