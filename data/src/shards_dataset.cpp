// The token_shards datasets: windows of memory-mapped token shards as batches.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "leantrain/data/dataset.h"
#include "leantrain/data/shards.h"
#include "leantrain/runtime/errors.h"
#include "lm_batch.h"

namespace lt::data {
namespace {

class ShardDataset final : public Dataset {
 public:
  ShardDataset(std::string name, std::string spec, ShardWindows windows, detail::LmSpec lm)
      : name_(std::move(name)), spec_(std::move(spec)), windows_(std::move(windows)), lm_(std::move(lm)) {}
  int64_t size() const override { return windows_.size(); }
  Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override {
    return detail::lm_batch(indices, epoch, size(), name_, lm_,
                            [this](int64_t i, int64_t* out) { windows_.window(i, out); });
  }
  std::string describe() const override {
    return name_ + ": " + std::to_string(size()) + " windows of " + std::to_string(lm_.seq_len) + "+1 tokens from " +
           std::to_string(windows_.shards().size()) + " shard(s) '" + spec_ + "' (" +
           std::to_string(windows_.total_tokens()) + " tokens), " + (lm_.bert ? "masked-LM" : "next-token");
  }

 private:
  std::string name_, spec_;
  ShardWindows windows_;
  detail::LmSpec lm_;
};

std::shared_ptr<Dataset> open_split(const std::string& name, const std::string& spec, const std::string& key,
                                    const TokenShardsConfig& c, int64_t vocab, const detail::LmSpec& lm) {
  std::vector<std::shared_ptr<const TokenShard>> shards;
  for (const auto& path : shard_paths(spec, key))
    shards.push_back(std::make_shared<const TokenShard>(path, c.format, c.dtype, vocab));
  ShardWindows windows(std::move(shards), lm.seq_len);
  if (windows.size() == 0)
    throw DataError(key + " = '" + spec + "': no shard holds a window of the model's seq_len+1 = " +
                    std::to_string(lm.seq_len + 1) + " tokens");
  return std::make_shared<ShardDataset>(name, spec, std::move(windows), lm);
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
  detail::LmSpec m;
  m.seq_len = model.seq_len;
  if (model.target == Target::kMaskedTokens) {
    if (c.mask_id < 0 || c.mask_id >= model.vocab_size)
      throw ConfigError("data.mask_id = " + std::to_string(c.mask_id) +
                        ": masked targets need the tokenizer's [MASK] id, below " + vkey + " = " +
                        std::to_string(model.vocab_size));
    m.bert = true;
    m.mask_prob = c.mask_prob;
    m.mask_token = c.mask_id;
    m.random_vocab = vocab;
    m.never = c.special_ids;
    m.seed = c.seed;
  }
  Datasets out;
  out.train = open_split("token_shards train", c.train, "data.train", c, vocab, m);
  if (!c.eval.empty()) out.eval = open_split("token_shards eval", c.eval, "data.eval", c, vocab, m);
  return out;
}

}  // namespace lt::data
