// InputContract's description.
#include "leantrain/runtime/contract.h"

#include "leantrain/runtime/options.h"

namespace lt {

InputContract InputContract::images(const Options& model, const std::string& channels_key,
                                    const std::string& size_key, const std::string& classes_key) {
  InputContract c;
  c.input = Input::kImages;
  c.target = Target::kClassLabels;
  c.channels = model.integer(channels_key);
  c.height = c.width = model.integer(size_key);
  c.num_classes = model.integer(classes_key);
  c.channels_key = "model." + channels_key;
  c.size_key = "model." + size_key;
  c.num_classes_key = "model." + classes_key;
  return c;
}

InputContract InputContract::tokens(const Options& model, const std::string& seq_len_key,
                                    const std::string& vocab_size_key, Target target) {
  InputContract c;
  c.input = Input::kTokens;
  c.target = target;
  c.seq_len = model.integer(seq_len_key);
  c.vocab_size = model.integer(vocab_size_key);
  c.seq_len_key = "model." + seq_len_key;
  c.vocab_size_key = "model." + vocab_size_key;
  return c;
}

std::string InputContract::describe() const {
  std::string s;
  if (input == Input::kTokens) {
    s = "tokens [B," + std::to_string(seq_len) + "] with ids < " + std::to_string(vocab_size);
  } else {
    s = "images [B," + std::to_string(channels) + "," + std::to_string(height) + "," + std::to_string(width) + "]";
  }
  for (const auto& f : fields) s += " + " + f;
  switch (target) {
    case Target::kClassLabels: return s + ", labels of " + std::to_string(num_classes) + " classes";
    case Target::kNextToken: return s + ", next-token targets";
    case Target::kMaskedTokens: return s + ", masked-token targets";
  }
  return s;
}

}  // namespace lt
