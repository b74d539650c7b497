// Token shards (data/shards.h, the token_shards kind): llm.c's header and nanoGPT's raw files,
// windows and their coverage, masked targets with the tokenizer's ids, and every bad file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "leantrain/data/data.h"
#include "leantrain/data/shards.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "expect_error.h"

namespace {

using lt_test::error_of;

using lt::data::TokenShard;

std::string scratch() {
  static const std::string dir = [] {
    std::string d = "/tmp/lt_shards_" + std::to_string(::getpid());
    std::system(("rm -rf " + d + " && mkdir -p " + d).c_str());
    return d;
  }();
  return dir;
}

// Writes an llm.c shard: header {magic, version, count} (count_override < 0: the true count),
// then the tokens as uint16 or uint32.
std::string write_llmc(const std::string& name, const std::vector<int64_t>& tokens, bool u32 = false,
                       int32_t magic = 0, int64_t count_override = -1) {
  const std::string path = scratch() + "/" + name;
  std::vector<int32_t> header(256, 0);
  header[0] = magic ? magic : (u32 ? lt::data::kLlmcMagicU32 : lt::data::kLlmcMagicU16);
  header[1] = u32 ? 7 : 1;  // llm.c's versions (gpt-2, llama-3)
  header[2] = static_cast<int32_t>(count_override >= 0 ? count_override : static_cast<int64_t>(tokens.size()));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (int64_t t : tokens) {
    if (u32) {
      const auto v = static_cast<uint32_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 4);
    } else {
      const auto v = static_cast<uint16_t>(t);
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  return path;
}

std::vector<int64_t> range(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t i = lo; i < hi; ++i) v.push_back(i);
  return v;
}

lt::InputContract gpt(int64_t seq_len, int64_t vocab) {
  lt::models::ModelConfig m;
  m.kind = "gpt";
  m.seq_len = seq_len;
  m.vocab_size = vocab;
  m.n_head = 2;
  return lt::models::model_contract(m);
}

TEST(TokenShards, WindowsCoverEveryShardInOrderWithoutCrossingAShard) {
  ::mkdir((scratch() + "/train").c_str(), 0755);
  write_llmc("train/a_000.bin", range(0, 100));
  write_llmc("train/a_001.bin", range(100, 150));
  lt::data::TokenShardsConfig c;
  c.train = scratch() + "/train";  // a directory: its *.bin, sorted
  const auto ds = lt::data::make_token_shards(c, gpt(8, 1000));
  ASSERT_EQ(ds.train->size(), 99 / 8 + 49 / 8);  // 12 + 6 windows
  EXPECT_EQ(ds.eval, nullptr);
  std::set<int64_t> firsts;
  for (int64_t i = 0; i < ds.train->size(); ++i) {
    const auto b = ds.train->get({i}, 0);
    const int64_t x0 = b.input[0][0].item<int64_t>();
    firsts.insert(x0);
    // next-token targets: target = input shifted by one, consecutive tokens of one shard
    for (int64_t t = 0; t < 8; ++t) {
      EXPECT_EQ(b.input[0][t].item<int64_t>(), x0 + t);
      EXPECT_EQ(b.target[0][t].item<int64_t>(), x0 + t + 1);
    }
    EXPECT_TRUE(x0 + 8 < 100 || x0 >= 100) << "window " << i << " crosses the first shard's end";
  }
  // Window starts: 0, 8, ..., 88 in the first shard, 100, 108, ..., 140 in the second.
  EXPECT_EQ(*firsts.begin(), 0);
  EXPECT_TRUE(firsts.count(88) && firsts.count(100) && firsts.count(140));
  EXPECT_EQ(firsts.size(), 18u);
  // A pure function of the index: the same batch twice (what exact resume rests on).
  EXPECT_TRUE(torch::equal(ds.train->get({3, 17}, 2).input, ds.train->get({3, 17}, 5).input));
  EXPECT_CONTAINS(ds.train->describe(), "18 windows of 8+1 tokens from 2 shard(s)");
}

TEST(TokenShards, Uint32AndHeaderlessShards) {
  const auto u32 = write_llmc("big.bin", {70000, 1, 69999, 2, 3}, /*u32=*/true);
  TokenShard s(u32, "llm.c", "", 70001);
  EXPECT_EQ(s.bytes_per_token(), 4);
  EXPECT_EQ(s.tokens(), 5);
  EXPECT_EQ(s.token(0), 70000);
  // nanoGPT's raw uint16: no header, the dtype given.
  const std::string raw = scratch() + "/raw.bin";
  {
    std::ofstream out(raw, std::ios::binary);
    for (uint16_t v : {7, 8, 9, 10}) out.write(reinterpret_cast<const char*>(&v), 2);
  }
  TokenShard r(raw, "raw", "uint16", 0);
  EXPECT_EQ(r.tokens(), 4);
  EXPECT_EQ(r.token(3), 10);
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { TokenShard(raw, "raw", "", 0); }), "data.dtype");
  // A raw file read as llm.c is refused by its magic.
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { TokenShard(raw, "llm.c", "", 0); }), "shorter than llm.c's 1024-byte header");
}

TEST(TokenShards, BadShardsAreErrorsNamingTheFile) {
  const auto wrong_magic = write_llmc("magic.bin", range(0, 10), false, 12345);
  auto msg = error_of<lt::DataError>([&] { TokenShard(wrong_magic, "llm.c", "", 0); });
  EXPECT_CONTAINS(msg, "magic.bin");
  EXPECT_CONTAINS(msg, "magic 12345 is not llm.c's");
  const auto truncated = write_llmc("truncated.bin", range(0, 10), false, 0, /*count=*/20);
  msg = error_of<lt::DataError>([&] { TokenShard(truncated, "llm.c", "", 0); });
  EXPECT_CONTAINS(msg, "truncated.bin");
  EXPECT_CONTAINS(msg, "the header counts 20 tokens");
  EXPECT_CONTAINS(msg, "(truncated)");
  const auto longer = write_llmc("longer.bin", range(0, 10), false, 0, /*count=*/5);
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { TokenShard(longer, "llm.c", "", 0); }), "the header counts 5 tokens");
  const auto version = write_llmc("version.bin", range(0, 10), /*u32=*/true);
  {
    std::fstream f(version, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t v = 1;  // llm.c writes uint32 shards with version 7
    f.seekp(4);
    f.write(reinterpret_cast<const char*>(&v), 4);
  }
  msg = error_of<lt::DataError>([&] { TokenShard(version, "llm.c", "", 0); });
  EXPECT_CONTAINS(msg, "version.bin");
  EXPECT_CONTAINS(msg, "llm.c version 1 with magic 20240801 (llm.c writes version 7)");
  const auto ids = write_llmc("ids.bin", {1, 2, 300, 4});
  msg = error_of<lt::DataError>([&] { TokenShard(ids, "llm.c", "", 256); });
  EXPECT_CONTAINS(msg, "ids.bin");
  EXPECT_CONTAINS(msg, "token 2 is id 300, not below the vocabulary size 256");
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { TokenShard(scratch() + "/none.bin", "llm.c", "", 0); }), "cannot open");
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::shard_paths(scratch() + "/nothing_*.bin", "data.train"); }),
                  "data.train");
  // Through the dataset: a model vocabulary too small for the shards' tokens names the model key.
  lt::data::TokenShardsConfig c;
  c.train = ids;
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { lt::data::make_token_shards(c, gpt(2, 256)); }), "id 300");
  c.vocab_size = 512;
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_token_shards(c, gpt(2, 256)); }),
                  "data.vocab_size = 512 is larger than model.vocab_size = 256");
}

TEST(TokenShards, MaskedTargetsUseTheTokenizersIdsAndNeverMaskSpecialTokens) {
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 400; ++i) tokens.push_back(i % 2 == 0 ? 5 : 10 + i % 50);  // 5: [SEP]-like
  lt::data::TokenShardsConfig c;
  c.train = write_llmc("mlm.bin", tokens);
  c.special_ids = {5};
  c.mask_prob = 0.5;
  lt::models::ModelConfig m;
  m.kind = "bert";
  m.seq_len = 16;
  m.vocab_size = 64;
  const auto bert = lt::models::model_contract(m);
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_token_shards(c, bert); }), "data.mask_id = -1");
  c.mask_id = 63;
  const auto ds = lt::data::make_token_shards(c, bert);
  int64_t masked = 0;
  for (int64_t i = 0; i < ds.train->size(); ++i) {
    const auto b = ds.train->get({i}, 1);
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t y = b.target[0][t].item<int64_t>(), x = b.input[0][t].item<int64_t>();
      if (t % 2 == 0) {  // the special positions: never chosen, never changed
        EXPECT_EQ(y, -100);
        EXPECT_EQ(x, 5);
      }
      masked += x == 63;
    }
  }
  EXPECT_GT(masked, 0);
}

TEST(TokenShards, ARegisteredKindTheConfigPicks) {
  const auto path = write_llmc("cfg.bin", range(0, 300));
  lt::DataSection d;
  d.kind = "token_shards";
  d.options.set("train", path);
  d.options.set("eval", path);
  d.limit = 5;
  const auto ds = lt::data::make_datasets(d, gpt(16, 512));
  EXPECT_EQ(ds.train->size(), 5);
  EXPECT_EQ(ds.eval->size(), 299 / 16);
  d.options.set("format", std::string("npy"));
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::data::make_datasets(d, gpt(16, 512)); }),
                  "data.format = \"npy\": allowed: llm.c | raw");
}

}  // namespace
