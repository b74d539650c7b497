#pragma once
// Datasets: turn sample indices into CPU batches. Every sample is a pure function of
// (config, epoch, index), so any rank can build any sample and the result does not depend on
// the parallel layout — the basis of the "same samples for any world size" invariant.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "leantrain/runtime/contract.h"

namespace lt::data {

/// Token id of [MASK] for text (byte-level) corpora: one past the 256 byte values.
constexpr int64_t kTextMaskToken = 256;
/// Target value the loss ignores (torch's cross_entropy default ignore_index).
constexpr int64_t kIgnoreIndex = -100;

/// One batch, on the CPU; the trainer moves it to the device.
struct Batch {
  torch::Tensor input, target;
  int64_t tokens = 0;  // input tokens (LM) or 0: feeds tokens/s without knowing the task
  /// Named inputs beside `input` (InputContract::fields), [B, ...] each.
  std::map<std::string, torch::Tensor> fields;
};

/// A batch's fields moved to `device` (what Model::forward_with takes); `non_blocking` for
/// pinned batches (pin_memory below).
inline std::map<std::string, torch::Tensor> fields_on(const Batch& batch, const torch::Device& device,
                                                      bool non_blocking = false) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, t] : batch.fields) out[name] = t.to(torch::TensorOptions().device(device), non_blocking);
  return out;
}

/// Note [Pinned batches]: on a GPU, a batch built in page-locked host memory is copied to the
/// device by DMA without a host sync (to(device, non_blocking = true)), so the copy overlaps the
/// previous micro-batch's kernels; a pageable one is staged and copied synchronously. The
/// trainer pins each batch on the prefetch thread (Prefetcher's `prepare`), off the step's
/// path; PyTorch's pinned-memory allocator keeps the host block until the copy has run.
/// Needs CUDA (not called on CPU runs).
inline void pin_memory(Batch& batch) {
  batch.input = batch.input.pin_memory();
  if (batch.target.defined()) batch.target = batch.target.pin_memory();
  for (auto& [name, t] : batch.fields) t = t.pin_memory();
}

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  /// Builds a CPU batch from sample indices. `epoch` feeds per-sample randomness (BERT masking) so that a
  /// sample's content depends only on (seed, epoch, index), never on which rank/micro-batch loads it.
  /// Const and stateless, hence safe to call from several threads. Throws std::out_of_range on an
  /// index outside [0, size()).
  virtual Batch get(const std::vector<int64_t>& indices, int64_t epoch) const = 0;
  /// One line for the run log, e.g. "fashion_mnist train: 60000 images 1x28x28, 10 classes".
  virtual std::string describe() const = 0;
  /// The names of the Batch::fields every batch carries (none by default).
  virtual std::vector<std::string> fields() const { return {}; }
};

/// The options of the built-in data kinds (fashion_mnist, text, synthetic) as one struct; the
/// data registry binds each kind's table to the members it reads (data/src/registry.cpp), and
/// fills seed from [data]'s shared key.
struct DataConfig {
  std::string kind = "fashion_mnist";  // fashion_mnist | text | synthetic
  std::string path = "/usr/share/datasets/fashion-mnist";
  uint64_t seed = 1234;
  double eval_fraction = 0.1;     // text: share of the corpus held out for evaluation
  double mask_prob = 0.15;        // masked-token targets
  int64_t synthetic_samples = 4096;
};

struct Datasets {
  std::shared_ptr<Dataset> train;
  std::shared_ptr<Dataset> eval;  // null only for text with data.eval_fraction = 0 (nothing held out)
};

/// Builds the built-in kind data.kind names, train/eval datasets to a model's input contract.
/// Validates the pairing up front (throws lt::ConfigError naming the model's key, from the
/// contract, that must change) so a bad config fails before any file is read:
///  - fashion_mnist: images [B,1,28,28] with 10 class labels; data.path = directory holding the 4 IDX files (.gz or not);
///    train = train-*, eval = t10k-*. input float [B,1,28,28] normalized (x/255 - 0.2860)/0.3530
///    (the training-set mean/std); target int64 [B].
///  - text: tokens with next-token or masked-token targets; byte-level tokens 0..255; [MASK] =
///    256 for masked targets, so the vocabulary must be >= 256 / >= 257. The last data.eval_fraction of the
///    bytes is eval (a contiguous tail, so no eval window overlaps a train window). Sample i is
///    the window starting at i*seq_len of length seq_len+1 (non-overlapping windows).
///    next-token: input = w[0:T], target = w[1:T+1], both int64 [B,T].
///    masked: input = w[0:T] with each position chosen with probability data.mask_prob from a stream
///    seeded by (seed, epoch, sample index) — at least one per sample — and a chosen position becomes
///    [MASK] 80%, a random token 10%, unchanged 10%; target = original token at chosen positions,
///    -100 elsewhere.
///  - synthetic: tokens: windows following t[i+1] = (a*t[i] + b) mod V', t[0] random, with (a,b)
///    one of 4 rules fixed by the seed and picked per sample from (seed, index) — a bigram model
///    already beats chance and context identifies the rule, so loss falls quickly. V' = vocab_size
///    for next-token targets; for masked V' = vocab_size-1 and [MASK] = vocab_size-1.
///    images float [C,H,W] ~ N(0,1) with label = argmax over classes of a fixed random
///    template (from the seed) dotted with the image average-pooled to a 4x4 grid per channel — a
///    deterministic function of the image, learnable, and cheap even at 224x224x1000 classes.
///    Train size data.synthetic_samples, eval size max(synthetic_samples/8, 64), eval samples drawn
///    from a separate stream; everything a pure function of (seed, index).
/// A missing path (fashion_mnist dir / text file) -> ConfigError "data.path: '<p>' does not exist ...";
/// a present but malformed file -> lt::DataError naming the file.
Datasets make_datasets(const DataConfig& data, const lt::InputContract& model);

/// The options of the token_shards kind (llm.c / nanoGPT token shards; shards.h).
struct TokenShardsConfig {
  std::string train;                // shard files: a glob, a directory (its *.bin) or a file
  std::string eval;                 // the same for evaluation; empty: no evaluation
  std::string format = "llm.c";     // llm.c | raw (headerless)
  std::string dtype;                // raw: uint16 | uint32; llm.c: empty (the header says) or the same
  int64_t vocab_size = 0;           // the tokenizer's; 0: the model's. Every token must be below it
  int64_t mask_id = -1;             // masked targets: the tokenizer's [MASK] id
  std::vector<int64_t> special_ids; // masked targets: ids never masked ([CLS], [SEP], [PAD], ...)
  double mask_prob = 0.15;
  uint64_t seed = 1234;
};

/// Train/eval datasets over token shards for a token model: window i (shards.h,
/// ShardWindows) gives input = w[0:T] and, for next-token targets, target = w[1:T+1]; for
/// masked targets the input is masked as the text kind does, with cfg.mask_id as [MASK],
/// replacements drawn below the vocabulary and cfg.special_ids never masked. Throws
/// lt::ConfigError for a model that does not take tokens, a vocabulary larger than the
/// model's, or masked targets without mask_id; lt::DataError naming the file for a bad shard.
Datasets make_token_shards(const TokenShardsConfig& cfg, const lt::InputContract& model);

/// The first n samples of `data` (data.limit): `data` itself when n <= 0 or n >= its size.
std::shared_ptr<Dataset> first_samples(std::shared_ptr<Dataset> data, int64_t n);

}  // namespace lt::data
