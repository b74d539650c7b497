// InputContract's description.
#include "leantrain/runtime/contract.h"

namespace lt {

const char* target_name(InputContract::Target t) {
  switch (t) {
    case InputContract::Target::kClassLabels: return "classify";
    case InputContract::Target::kNextToken: return "causal_lm";
    case InputContract::Target::kMaskedTokens: return "masked_lm";
  }
  return "unknown";
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
