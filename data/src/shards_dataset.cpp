// The token_shards datasets: windows of memory-mapped token shards as batches.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "leantrain/data/dataset.h"
#include "leantrain/data/shards.h"
#include "leantrain/runtime/errors.h"
#include "samples.h"

namespace lt::data {
namespace {

struct Masking {
  bool on = false;
  double prob = 0;
  int64_t mask_id = -1, vocab = 0;
  std::vector<int64_t> special;
  uint64_t seed = 0;
};

class ShardDataset final : public Dataset {
 public:
  ShardDataset(std::string name, std::string spec, ShardWindows windows, int64_t seq_len, Masking masking)
      : name_(std::move(name)), spec_(std::move(spec)), windows_(std::move(windows)), T_(seq_len),
        masking_(std::move(masking)) {}
  int64_t size() const override { return windows_.size(); }
  Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override {
    const auto B = static_cast<int64_t>(indices.size());
    Batch b;
    b.input = torch::empty({B, T_}, torch::kLong);
    b.target = torch::empty({B, T_}, torch::kLong);
    b.tokens = B * T_;
    int64_t* x = b.input.data_ptr<int64_t>();
    int64_t* y = b.target.data_ptr<int64_t>();
    std::vector<int64_t> w(static_cast<size_t>(T_ + 1));
    for (int64_t n = 0; n < B; ++n) {
      const int64_t i = indices[static_cast<size_t>(n)];
      if (i < 0 || i >= size())
        throw std::out_of_range(name_ + ": sample index " + std::to_string(i) + " outside [0, " + std::to_string(size()) + ")");
      windows_.window(i, w.data());
      std::copy(w.begin(), w.begin() + T_, x + n * T_);
      if (masking_.on) {
        detail::bert_mask(x + n * T_, y + n * T_, T_, masking_.seed, epoch, i, masking_.prob, masking_.mask_id,
                          masking_.vocab, masking_.special);
      } else {
        std::copy(w.begin() + 1, w.end(), y + n * T_);
      }
    }
    return b;
  }
  std::string describe() const override {
    return name_ + ": " + std::to_string(size()) + " windows of " + std::to_string(T_) + "+1 tokens from " +
           std::to_string(windows_.shards().size()) + " shard(s) '" + spec_ + "' (" +
           std::to_string(windows_.total_tokens()) + " tokens), " + (masking_.on ? "masked-LM" : "next-token");
  }

 private:
  std::string name_, spec_;
  ShardWindows windows_;
  int64_t T_;
  Masking masking_;
};

std::shared_ptr<Dataset> open_split(const std::string& name, const std::string& spec, const std::string& key,
                                    const TokenShardsConfig& c, int64_t vocab, int64_t seq_len, const Masking& m) {
  std::vector<std::shared_ptr<const TokenShard>> shards;
  for (const auto& path : shard_paths(spec, key))
    shards.push_back(std::make_shared<const TokenShard>(path, c.format, c.dtype, vocab));
  ShardWindows windows(std::move(shards), seq_len);
  if (windows.size() == 0)
    throw DataError(key + " = '" + spec + "': no shard holds a window of the model's seq_len+1 = " +
                    std::to_string(seq_len + 1) + " tokens");
  return std::make_shared<ShardDataset>(name, spec, std::move(windows), seq_len, m);
}

}  // namespace

Datasets make_token_shards(const TokenShardsConfig& c, const lt::InputContract& model) {
  using Target = lt::InputContract::Target;
  if (model.input != lt::InputContract::Input::kTokens || model.target == Target::kClassLabels)
    throw ConfigError("data.kind = 'token_shards' gives tokens with next-token or masked-token targets; the model takes " +
                      model.describe());
  const std::string vkey = model.vocab_size_key.empty() ? "the model's vocabulary" : model.vocab_size_key;
  const int64_t vocab = c.vocab_size > 0 ? c.vocab_size : model.vocab_size;
  if (vocab > model.vocab_size)
    throw ConfigError("data.vocab_size = " + std::to_string(c.vocab_size) + " is larger than " + vkey + " = " +
                      std::to_string(model.vocab_size) + " (the model needs an embedding per token id)");
  Masking m;
  if (model.target == Target::kMaskedTokens) {
    if (c.mask_id < 0 || c.mask_id >= model.vocab_size)
      throw ConfigError("data.mask_id = " + std::to_string(c.mask_id) +
                        ": masked targets need the tokenizer's [MASK] id, below " + vkey + " = " +
                        std::to_string(model.vocab_size));
    m.on = true;
    m.prob = c.mask_prob;
    m.mask_id = c.mask_id;
    m.vocab = vocab;
    m.special = c.special_ids;
    m.seed = c.seed;
  }
  Datasets out;
  out.train = open_split("token_shards train", c.train, "data.train", c, vocab, model.seq_len, m);
  if (!c.eval.empty()) out.eval = open_split("token_shards eval", c.eval, "data.eval", c, vocab, model.seq_len, m);
  return out;
}

}  // namespace lt::data
