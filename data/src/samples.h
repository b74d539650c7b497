#pragma once
// Private: per-sample content (masking, synthetic tokens and images) as torch-free functions on
// raw buffers; datasets.cpp only wraps them in tensors. Each is a pure function of its arguments.
#include <cstdint>
#include <vector>

namespace lt::data::detail {

/// BERT masked-LM corruption of one sample of length T. On entry `input` holds the original
/// tokens; on exit the corrupted ones, and `target` the original token at chosen positions and
/// -100 elsewhere. Randomness comes only from (seed, epoch, index). Positions holding a token in
/// `never` ([CLS], [SEP], [PAD]) are never chosen. Returns how many were chosen.
int64_t bert_mask(int64_t* input, int64_t* target, int64_t T, uint64_t seed, int64_t epoch, int64_t index,
                  double mask_prob, int64_t mask_token, int64_t random_vocab, const std::vector<int64_t>& never = {});

/// Synthetic token rules: t[i+1] = (a*t[i] + b) mod vocab, 4 (a, b) pairs fixed by the seed.
struct TokenRules {
  int64_t vocab = 0;
  int64_t a[4] = {}, b[4] = {};
  TokenRules(uint64_t seed, int64_t vocab);
  /// Writes `len` tokens of sample `index` of split `stream` into `out`.
  void sample(int64_t* out, int64_t len, uint64_t seed, uint64_t stream, int64_t index) const;
};

/// Synthetic image classes: one random template per class over a 4x4 average-pooled grid.
struct ImageTemplates {
  int64_t channels = 0, size = 0, classes = 0, grid = 0;
  std::vector<double> weights;  // classes x (channels * grid * grid)
  ImageTemplates(uint64_t seed, int64_t channels, int64_t size, int64_t classes);
  /// Writes image `index` of split `stream` (channels*size*size floats, N(0,1)) into `out` and
  /// returns its label.
  int64_t sample(float* out, uint64_t seed, uint64_t stream, int64_t index) const;
};

}  // namespace lt::data::detail
