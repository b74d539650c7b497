#pragma once
// The input contract between a model and its data: what a model's forward takes and what
// its loss compares against. A registered model kind declares one from its options; a data
// kind builds batches to it, or refuses it with a ConfigError that names both sides. Data and
// model meet only here, never through each other's kind names. Torch-free.
#include <cstdint>
#include <string>
#include <vector>

namespace lt {

class Options;

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

  /// Images [B, channels, size, size] -> labels of `classes` classes, each size read from the
  /// model's resolved options under the given option key (an integer option of its table), and
  /// named in messages as model.<key>. A kind registers its contract in one line:
  ///   kind.contract = [](const Options& o) { return InputContract::images(o, "channels", "image", "classes"); };
  static InputContract images(const Options& model, const std::string& channels_key, const std::string& size_key,
                              const std::string& classes_key);
  /// Tokens [B, seq_len] with ids < vocab_size -> `target` (next-token or masked-token) targets,
  /// read from the model's options as images() does.
  static InputContract tokens(const Options& model, const std::string& seq_len_key, const std::string& vocab_size_key,
                              Target target = Target::kNextToken);

  /// One line, e.g. "tokens [B,128] with ids < 256, next-token targets" or
  /// "images [B,1,28,28], labels of 10 classes".
  std::string describe() const;
};

}  // namespace lt
