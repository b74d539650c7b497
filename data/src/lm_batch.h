#pragma once
// Private: the batch layout every token dataset shares (text, synthetic tokens, token_shards):
// sample i is a window of seq_len + 1 tokens; the input is its first seq_len tokens, the target
// the next token at each position, or BERT's masked-LM targets.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "leantrain/data/dataset.h"

namespace lt::data::detail {

struct LmSpec {
  int64_t seq_len = 0;
  bool bert = false;             // masked-LM targets (bert_mask) instead of next-token ones
  double mask_prob = 0.0;
  int64_t mask_token = 0;
  int64_t random_vocab = 0;      // bert: a "random token" replacement is drawn from [0, random_vocab)
  std::vector<int64_t> never;    // bert: ids never masked ([CLS], [SEP], [PAD], ...)
  uint64_t seed = 0;
};

/// Throws std::out_of_range naming `name` for an index outside [0, size).
void check_indices(const std::vector<int64_t>& indices, int64_t size, const std::string& name);

/// The batch of `indices` (checked against [0, size)): window_of(i, out) writes the
/// seq_len + 1 tokens of sample i; input = w[0:T]; target = w[1:T+1], or, with spec.bert, the
/// input masked by bert_mask from (seed, epoch, i) and the original tokens at masked positions.
Batch lm_batch(const std::vector<int64_t>& indices, int64_t epoch, int64_t size, const std::string& name,
               const LmSpec& spec, const std::function<void(int64_t, int64_t*)>& window_of);

}  // namespace lt::data::detail
