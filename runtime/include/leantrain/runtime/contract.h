#pragma once
// The input contract between a model and its data: what a model's forward takes and what
// its loss compares against. A registered model kind declares one from its options; a data
// kind builds batches to it, or refuses it with a ConfigError that names both sides. Data and
// model meet only here, never through each other's kind names. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

struct InputContract {
  enum class Input { kTokens, kImages };
  enum class Target { kClassLabels, kNextToken, kMaskedTokens };

  Input input = Input::kImages;
  Target target = Target::kClassLabels;
  /// kTokens: int64 ids [B, seq_len] in [0, vocab_size).
  int64_t seq_len = 0, vocab_size = 0;
  /// kImages: float [B, channels, height, width].
  int64_t channels = 0, height = 0, width = 0;
  /// kClassLabels: int64 [B] in [0, num_classes).
  int64_t num_classes = 0;
  /// Named inputs beside the main one that the model reads (e.g. "token_types",
  /// "attention_mask"): each must be in the data's Batch::fields, [B, ...] like the input.
  std::vector<std::string> fields;
  /// Where the model's config sets each size, for messages: e.g. "model.seq_len". Empty:
  /// fixed by the model (the message then names no key to change).
  std::string seq_len_key, vocab_size_key, channels_key, size_key, num_classes_key;

  /// One line, e.g. "tokens [B,128] with ids < 256, next-token targets" or
  /// "images [B,1,28,28], labels of 10 classes".
  std::string describe() const;
};

/// "classify" | "causal_lm" | "masked_lm" (the metric names of a model's task).
const char* target_name(InputContract::Target t);

}  // namespace lt
