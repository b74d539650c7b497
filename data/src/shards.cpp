// Token shards: header checks, the read-only mapping, window indexing. Torch-free.
#include "leantrain/data/shards.h"

#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "leantrain/runtime/errors.h"

namespace lt::data {
namespace {

constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;

std::string quoted(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void bad_file(const std::string& path, const std::string& why) {
  throw DataError("token shard " + quoted(path) + ": " + why);
}

int dtype_bytes(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  return 0;
}

}  // namespace

TokenShard::TokenShard(const std::string& path, const std::string& format, const std::string& dtype, int64_t vocab)
    : path_(path) {
  if (format != "llm.c" && format != "raw")
    throw ConfigError("data.format = \"" + format + "\": allowed: llm.c | raw");
  if (!dtype.empty() && dtype_bytes(dtype) == 0)
    throw ConfigError("data.dtype = \"" + dtype + "\": allowed: uint16 | uint32 (or empty for llm.c's header)");
  if (format == "raw" && dtype.empty())
    throw ConfigError("data.dtype: headerless (raw) shards need the token type: \"uint16\" or \"uint32\"");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) bad_file(path, std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    bad_file(path, std::string("cannot stat: ") + std::strerror(errno));
  }
  const auto size = static_cast<int64_t>(st.st_size);
  if (size > 0) {
    map_ = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (map_ == MAP_FAILED) {
      map_ = nullptr;
      ::close(fd);
      bad_file(path, std::string("cannot map: ") + std::strerror(errno));
    }
    map_bytes_ = static_cast<size_t>(size);
  }
  ::close(fd);
  const auto* base = static_cast<const unsigned char*>(map_);
  int64_t offset = 0;
  try {
    if (format == "llm.c") {
      if (size < kHeaderBytes)
        bad_file(path, std::to_string(size) + " bytes, shorter than llm.c's 1024-byte header (truncated, or not a shard)");
      int32_t header[3];
      std::memcpy(header, base, sizeof header);
      if (header[0] == kLlmcMagicU16) {
        bytes_ = 2;
      } else if (header[0] == kLlmcMagicU32) {
        bytes_ = 4;
      } else {
        bad_file(path, "magic " + std::to_string(header[0]) + " is not llm.c's (" + std::to_string(kLlmcMagicU16) +
                           " for uint16 tokens, " + std::to_string(kLlmcMagicU32) +
                           " for uint32); headerless files need data.format = \"raw\"");
      }
      // llm.c's dev/data/data_common.py writes version 1 with uint16 (gpt-2) and 7 with uint32
      // (llama-3).
      const int32_t version = bytes_ == 2 ? 1 : 7;
      if (header[1] != version)
        bad_file(path, "llm.c version " + std::to_string(header[1]) + " with magic " + std::to_string(header[0]) +
                           " (llm.c writes version " + std::to_string(version) + ")");
      if (!dtype.empty() && dtype_bytes(dtype) != bytes_)
        bad_file(path, "the header says " + std::string(bytes_ == 2 ? "uint16" : "uint32") +
                           " tokens, data.dtype says " + dtype);
      tokens_ = header[2];
      offset = kHeaderBytes;
      const int64_t want = kHeaderBytes + tokens_ * bytes_;
      if (tokens_ < 0 || want != size)
        bad_file(path, "the header counts " + std::to_string(tokens_) + " tokens (" + std::to_string(want) +
                           " bytes with the header) but the file has " + std::to_string(size) + " bytes" +
                           (want > size ? " (truncated)" : ""));
    } else {
      bytes_ = dtype_bytes(dtype);
      if (size % bytes_ != 0)
        bad_file(path, std::to_string(size) + " bytes is not a whole number of " + dtype + " tokens (truncated?)");
      tokens_ = size / bytes_;
    }
    if (tokens_ < 2) bad_file(path, "holds " + std::to_string(tokens_) + " tokens; a window needs at least 2");
    data_ = base + offset;
    if (vocab > 0) {
      for (int64_t i = 0; i < tokens_; ++i) {
        const int64_t t = token(i);
        if (t >= vocab)
          bad_file(path, "token " + std::to_string(i) + " is id " + std::to_string(t) +
                             ", not below the vocabulary size " + std::to_string(vocab) +
                             " (data.vocab_size, or the model's)");
      }
    }
  } catch (...) {
    if (map_) ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

TokenShard::~TokenShard() {
  if (map_) ::munmap(map_, map_bytes_);
}

int64_t TokenShard::token(int64_t i) const {
  const unsigned char* p = data_ + i * bytes_;
  if (bytes_ == 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

void TokenShard::read(int64_t begin, int64_t n, int64_t* out) const {
  for (int64_t i = 0; i < n; ++i) out[i] = token(begin + i);
}

std::vector<std::string> shard_paths(const std::string& spec, const std::string& key) {
  if (spec.empty()) throw ConfigError(key + " = \"\": give the shard files (a glob, a directory or a file)");
  struct stat st {};
  std::string pattern = spec;
  if (::stat(spec.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) pattern = spec + "/*.bin";
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) throw ConfigError(key + " = \"" + spec + "\": no shard file matches (" + pattern + ")");
  std::sort(out.begin(), out.end());
  return out;
}

ShardWindows::ShardWindows(std::vector<std::shared_ptr<const TokenShard>> shards, int64_t seq_len)
    : shards_(std::move(shards)), seq_len_(seq_len) {
  int64_t total = 0;
  starts_.push_back(0);
  for (const auto& s : shards_) {
    total += (s->tokens() - 1) / seq_len_;
    starts_.push_back(total);
  }
}

void ShardWindows::window(int64_t i, int64_t* out) const {
  // The shard holding window i: the last k with starts_[k] <= i.
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  const auto k = static_cast<size_t>(it - starts_.begin() - 1);
  shards_[k]->read((i - starts_[k]) * seq_len_, seq_len_ + 1, out);
}

int64_t ShardWindows::total_tokens() const {
  int64_t n = 0;
  for (const auto& s : shards_) n += s->tokens();
  return n;
}

}  // namespace lt::data
