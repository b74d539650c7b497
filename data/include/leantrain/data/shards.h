#pragma once
// Pre-tokenized token shards, memory-mapped: llm.c's format (a 256 x int32 header: magic
// 20240520 with uint16 tokens or 20240801 with uint32, a version, the token count; then the
// tokens) and nanoGPT's headerless .bin (uint16 or uint32, the dtype given). Torch-free: the
// dataset over them (token_shards, data/src/shards_dataset.cpp) builds batches from windows.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lt::data {

/// llm.c's magic numbers.
constexpr int32_t kLlmcMagicU16 = 20240520;
constexpr int32_t kLlmcMagicU32 = 20240801;

/// One shard file, mapped read-only.
class TokenShard {
 public:
  /// Opens and checks `path`: format "llm.c" (dtype "" or the header's) or "raw" (dtype
  /// "uint16" | "uint32", required). Throws lt::DataError naming the file on a missing or
  /// unreadable file, a wrong magic or version, a size that disagrees with the header's token
  /// count (a truncated shard), a raw file whose size is not a whole number of tokens, or no
  /// tokens; lt::ConfigError on a bad format/dtype. When vocab > 0, every token is checked to
  /// be < vocab (an error names the file, the position and the id).
  TokenShard(const std::string& path, const std::string& format, const std::string& dtype, int64_t vocab);
  ~TokenShard();
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;

  const std::string& path() const { return path_; }
  int64_t tokens() const { return tokens_; }
  int bytes_per_token() const { return bytes_; }
  /// Token i (0 <= i < tokens()).
  int64_t token(int64_t i) const;
  /// Copies tokens [begin, begin + n) into out.
  void read(int64_t begin, int64_t n, int64_t* out) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  const unsigned char* data_ = nullptr;  // the first token
  int64_t tokens_ = 0;
  int bytes_ = 2;
};

/// The shard files `spec` names, sorted: a glob pattern ("data/fortunes_train_*.bin"), a
/// directory (its *.bin files) or a file. Throws lt::ConfigError naming `key` when nothing
/// matches.
std::vector<std::string> shard_paths(const std::string& spec, const std::string& key);

/// The windows of seq_len + 1 tokens over a list of shards: window w of a shard starts at
/// w * seq_len (consecutive windows share one token, the next window's first input is the
/// previous one's last target), and never crosses a shard's end. Window i of the set is a
/// pure function of (shards, seq_len, i): the epoch's permutation over 0..size()-1 covers
/// every window once.
class ShardWindows {
 public:
  ShardWindows(std::vector<std::shared_ptr<const TokenShard>> shards, int64_t seq_len);
  int64_t size() const { return starts_.empty() ? 0 : starts_.back(); }
  /// Writes the seq_len + 1 tokens of window i.
  void window(int64_t i, int64_t* out) const;
  const std::vector<std::shared_ptr<const TokenShard>>& shards() const { return shards_; }
  int64_t total_tokens() const;

 private:
  std::vector<std::shared_ptr<const TokenShard>> shards_;
  int64_t seq_len_;
  std::vector<int64_t> starts_;  // starts_[k]: windows before shard k; back(): all
};

}  // namespace lt::data
