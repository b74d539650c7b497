// Tests for the data layer: IDX and text readers, epoch shuffling, micro-batch slicing, and the
// datasets built by make_datasets (Fashion-MNIST, text, synthetic).
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "leantrain/data/data.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"

using namespace lt::data;

// No std::filesystem here: the LibTorch wheel's libtorch.so exports a partial, broken copy of
// libstdc++'s std::filesystem symbols (remove_all crashes through a null pointer), and they win
// symbol resolution in any binary linked against it. POSIX calls instead.

namespace {

const std::string kFashion = "/usr/share/datasets/fashion-mnist";
const std::string kFortunes = "/usr/share/games/fortunes";

bool path_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}
bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void remove_tree(const std::string& p) {
  if (is_dir(p)) {
    if (DIR* d = ::opendir(p.c_str())) {
      while (dirent* e = ::readdir(d)) {
        const std::string name = e->d_name;
        if (name != "." && name != "..") remove_tree(p + "/" + name);
      }
      ::closedir(d);
    }
    ::rmdir(p.c_str());
  } else {
    ::unlink(p.c_str());
  }
}

// A fresh directory, removed with everything in it when the test ends.
struct TempDir {
  std::string path;
  TempDir() {
    std::string tmpl = "/tmp/lt_test_data_XXXXXX";
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = tmpl;
  }
  ~TempDir() { remove_tree(path); }
  std::string file(const std::string& name, const std::string& bytes) const {
    const std::string p = path + "/" + name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  std::string sub(const std::string& name) const { return path + "/" + name; }
};

std::string be32(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8), static_cast<char>(v)};
}

template <class Fn>
std::string error_message_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t r) {
  torch::Tensor x = t[r].contiguous();
  return {x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel()};
}

std::vector<int64_t> iota(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The built-in datasets for a built-in model's contract, data.limit applied as the data
// registry applies it.
Datasets make_datasets(const lt::data::DataConfig& d, const lt::models::ModelConfig& m, int64_t limit = 0) {
  Datasets ds = lt::data::make_datasets(d, lt::models::model_contract(m));
  ds.train = first_samples(ds.train, limit);
  return ds;
}

lt::models::ModelConfig lm_model(const std::string& kind, int64_t seq_len, int64_t vocab) {
  lt::models::ModelConfig m;
  m.kind = kind;
  m.seq_len = seq_len;
  m.vocab_size = vocab;
  return m;
}

// A corpus with distinct, position-revealing bytes (i mod 251).
std::string pattern_corpus(size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>(i % 251);
  return s;
}

}  // namespace

// ------------------------------------------------------------------------------------------------
// IDX reader

class FashionIdx : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!path_exists(kFashion)) return;
    train_images = new IdxImages(read_idx_images(kFashion + "/train-images-idx3-ubyte.gz"));
    train_labels = new IdxLabels(read_idx_labels(kFashion + "/train-labels-idx1-ubyte.gz"));
    test_images = new IdxImages(read_idx_images(kFashion + "/t10k-images-idx3-ubyte.gz"));
    test_labels = new IdxLabels(read_idx_labels(kFashion + "/t10k-labels-idx1-ubyte.gz"));
  }
  static void TearDownTestSuite() {
    delete train_images;
    delete train_labels;
    delete test_images;
    delete test_labels;
  }
  void SetUp() override {
    if (train_images == nullptr) GTEST_SKIP() << kFashion << " not installed";
  }
  static inline IdxImages* train_images = nullptr;
  static inline IdxLabels* train_labels = nullptr;
  static inline IdxImages* test_images = nullptr;
  static inline IdxLabels* test_labels = nullptr;
};

TEST_F(FashionIdx, Shapes) {
  EXPECT_EQ(train_images->count, 60000);
  EXPECT_EQ(train_images->rows, 28);
  EXPECT_EQ(train_images->cols, 28);
  EXPECT_EQ(train_images->pixels.size(), 60000u * 28 * 28);
  EXPECT_EQ(test_images->count, 10000);
  EXPECT_EQ(test_images->rows, 28);
  EXPECT_EQ(test_images->cols, 28);
  EXPECT_EQ(test_images->pixels.size(), 10000u * 28 * 28);
  EXPECT_EQ(train_labels->count, 60000);
  EXPECT_EQ(test_labels->count, 10000);
}

TEST_F(FashionIdx, LabelHistogramAndFirstLabel) {
  std::vector<int64_t> train_hist(10, 0), test_hist(10, 0);
  for (uint8_t l : train_labels->labels) ++train_hist.at(l);
  for (uint8_t l : test_labels->labels) ++test_hist.at(l);
  for (int c = 0; c < 10; ++c) {
    EXPECT_EQ(train_hist[c], 6000) << "class " << c;
    EXPECT_EQ(test_hist[c], 1000) << "class " << c;
  }
  EXPECT_EQ(train_labels->labels[0], 9);  // the first training image is an ankle boot
}

TEST(IdxReader, WrongMagicNamesFile) {
  TempDir dir;
  const std::string p = dir.file("bad-images-idx3-ubyte", be32(0x00000801) + be32(1) + be32(2) + be32(2) + "abcd");
  const std::string msg = error_message_of([&] { read_idx_images(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  EXPECT_NE(msg.find("magic"), std::string::npos) << msg;
  EXPECT_THROW(read_idx_images(p), lt::DataError);
  // The same file is a perfectly good header for... nothing: labels want 0x801 and 1 dim.
  EXPECT_THROW(read_idx_labels(p), lt::DataError);
}

TEST(IdxReader, TruncatedNamesFile) {
  TempDir dir;
  const std::string p = dir.file("short-images-idx3-ubyte", be32(0x00000803) + be32(10) + be32(28) + be32(28) +
                                                                std::string(100, '\x7f'));
  EXPECT_THROW(read_idx_images(p), lt::DataError);
  const std::string msg = error_message_of([&] { read_idx_images(p); });
  EXPECT_NE(msg.find(p), std::string::npos) << msg;
  // A header cut short.
  const std::string h = dir.file("hdr-labels-idx1-ubyte", be32(0x00000801) + "\x00\x01");
  EXPECT_THROW(read_idx_labels(h), lt::DataError);
  EXPECT_NE(error_message_of([&] { read_idx_labels(h); }).find(h), std::string::npos);
}

TEST(IdxReader, TruncatedGzipNamesFile) {
  const std::string src = kFashion + "/train-labels-idx1-ubyte.gz";
  if (!path_exists(src)) GTEST_SKIP() << src << " not installed";
  TempDir dir;
  std::ifstream in(src, std::ios::binary);
  std::string bytes(2000, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  const std::string p = dir.file("cut-labels-idx1-ubyte.gz", bytes);
  EXPECT_THROW(read_idx_labels(p), lt::DataError);
  EXPECT_NE(error_message_of([&] { read_idx_labels(p); }).find(p), std::string::npos);
}

TEST(IdxReader, UncompressedAndGzFallback) {
  TempDir dir;
  const std::string p = dir.file("x-labels-idx1-ubyte", be32(0x00000801) + be32(3) + "\x01\x02\x03");
  IdxLabels a = read_idx_labels(p);
  ASSERT_EQ(a.count, 3);
  EXPECT_EQ(a.labels, (std::vector<uint8_t>{1, 2, 3}));
  IdxLabels b = read_idx_labels(p + ".gz");  // the unpacked file is found under the .gz name
  EXPECT_EQ(b.labels, a.labels);
  const std::string missing = dir.sub("nope-labels-idx1-ubyte.gz");
  EXPECT_THROW(read_idx_labels(missing), lt::DataError);
  EXPECT_NE(error_message_of([&] { read_idx_labels(missing); }).find(missing), std::string::npos);
}

// ------------------------------------------------------------------------------------------------
// Text reader

TEST(TextReader, FileAndDirectory) {
  TempDir dir;
  const std::string f = dir.file("one.txt", "hello\nworld\n");
  EXPECT_EQ(read_text_corpus(f), "hello\nworld\n");

  TempDir d2;
  d2.file("b", "BBB");
  d2.file("a", "AA");
  d2.file("a.dat", "index");    // fortune index: skipped
  d2.file("b.u8", "utf8 copy");  // fortune UTF-8 duplicate: skipped
  d2.file(".hidden", "H");
  ::mkdir(d2.sub("sub").c_str(), 0755);
  const std::string text = read_text_corpus(d2.path);
  EXPECT_EQ(text, "AABBB");
  EXPECT_EQ(text.size(), 5u);

  TempDir empty;
  EXPECT_THROW(read_text_corpus(empty.path), lt::DataError);
  EXPECT_THROW(read_text_corpus(dir.sub("missing")), lt::DataError);
}

TEST(TextReader, FortunesDirectory) {
  if (!is_dir(kFortunes)) GTEST_SKIP() << kFortunes << " not installed";
  size_t expected = 0;
  DIR* d = ::opendir(kFortunes.c_str());
  ASSERT_NE(d, nullptr);
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    auto ends = [&](const std::string& suf) {
      return name.size() >= suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    struct stat st {};
    const std::string p = kFortunes + "/" + name;
    if (name[0] != '.' && !ends(".dat") && !ends(".u8") && ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      expected += static_cast<size_t>(st.st_size);
    }
  }
  ::closedir(d);
  const std::string text = read_text_corpus(kFortunes);
  EXPECT_EQ(text.size(), expected);
  EXPECT_GT(text.size(), 100000u);
}

// ------------------------------------------------------------------------------------------------
// Sampling

TEST(Sampling, EpochPermutationIsDeterministicPermutation) {
  const auto p0 = epoch_permutation(1000, 42, 0);
  EXPECT_EQ(p0, epoch_permutation(1000, 42, 0));
  std::vector<int64_t> sorted = p0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, iota(1000));
  EXPECT_NE(p0, iota(1000));
  EXPECT_NE(p0, epoch_permutation(1000, 42, 1));
  EXPECT_NE(p0, epoch_permutation(1000, 43, 0));
  EXPECT_TRUE(epoch_permutation(0, 1, 0).empty());
  EXPECT_EQ(epoch_permutation(1, 1, 0), std::vector<int64_t>{0});
}

TEST(Sampling, MicroBatchUnionIndependentOfLayout) {
  const int64_t m = 4;
  const auto perm = epoch_permutation(100, 7, 3);  // G = 16: 6 global batches, 4 samples dropped
  EXPECT_EQ(global_batches_per_epoch(100, 16), 6);
  auto union_of = [&](int64_t world, int64_t accum, int64_t micro, int64_t k) {
    std::vector<int64_t> all;
    for (int64_t r = 0; r < world; ++r)
      for (int64_t j = 0; j < accum; ++j) {
        auto idx = micro_batch_indices(perm, k, micro, accum, world, r, j);
        EXPECT_EQ(static_cast<int64_t>(idx.size()), micro);
        all.insert(all.end(), idx.begin(), idx.end());
      }
    std::sort(all.begin(), all.end());
    return all;
  };
  for (int64_t k = 0; k < 6; ++k) {
    const auto a = union_of(2, 2, m, k);
    EXPECT_EQ(a, union_of(1, 4, m, k)) << "k=" << k;
    EXPECT_EQ(a, union_of(1, 2, 2 * m, k)) << "k=" << k;
    EXPECT_EQ(a.size(), 16u);
    std::vector<int64_t> expect(perm.begin() + k * 16, perm.begin() + (k + 1) * 16);
    std::sort(expect.begin(), expect.end());
    EXPECT_EQ(a, expect);
  }
  // Chunk (r*accum + j): rank 1, micro-batch 0 of 2 is the third chunk.
  const auto c = micro_batch_indices(perm, 1, m, 2, 2, 1, 0);
  EXPECT_EQ(c, std::vector<int64_t>(perm.begin() + 16 + 8, perm.begin() + 16 + 12));
  EXPECT_THROW(micro_batch_indices(perm, 6, m, 2, 2, 0, 0), std::out_of_range);
  EXPECT_THROW(micro_batch_indices(perm, 0, m, 2, 2, 2, 0), std::invalid_argument);
  EXPECT_THROW(micro_batch_indices(perm, 0, m, 2, 2, 0, 2), std::invalid_argument);
}

// ------------------------------------------------------------------------------------------------
// Text datasets

TEST(TextDataset, GptWindows) {
  TempDir dir;
  const std::string corpus = pattern_corpus(1000);
  lt::data::DataConfig d;
  d.kind = "text";
  d.path = dir.file("corpus.txt", corpus);
  d.eval_fraction = 0.1;  // last 100 bytes
  const auto ds = make_datasets(d, lm_model("gpt", 16, 256));
  ASSERT_TRUE(ds.train && ds.eval);
  EXPECT_EQ(ds.train->size(), (900 - 1) / 16);
  EXPECT_EQ(ds.eval->size(), (100 - 1) / 16);
  const Batch b = ds.train->get({0, 3}, 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(b.input.scalar_type(), torch::kLong);
  EXPECT_EQ(b.tokens, 32);
  const auto x = row(b.input, 1), y = row(b.target, 1);
  for (int64_t t = 0; t < 16; ++t) {
    EXPECT_EQ(x[t], static_cast<int64_t>(static_cast<unsigned char>(corpus[48 + t])));
    EXPECT_EQ(y[t], static_cast<int64_t>(static_cast<unsigned char>(corpus[49 + t])));
  }
  // The eval split starts right after the training bytes.
  EXPECT_EQ(row(ds.eval->get({0}, 0).input, 0)[0], 900 % 251);
  EXPECT_THROW(ds.train->get({ds.train->size()}, 0), std::out_of_range);

  const auto first5 = make_datasets(d, lm_model("gpt", 16, 256), 5).train;
  EXPECT_EQ(first5->size(), 5);
  EXPECT_TRUE(torch::equal(first5->get({4}, 0).input, ds.train->get({4}, 0).input));
  EXPECT_THROW(first5->get({5}, 0), std::out_of_range);
  EXPECT_NE(first5->describe().find("the first 5 used (data.limit)"), std::string::npos) << first5->describe();
  d.eval_fraction = 0.0;
  EXPECT_EQ(make_datasets(d, lm_model("gpt", 16, 256)).eval, nullptr);
  d.eval_fraction = 0.01;  // 10 bytes: no room for a 17-byte window
  EXPECT_NE(error_message_of([&] { make_datasets(d, lm_model("gpt", 16, 256)); }).find("data.eval_fraction"),
            std::string::npos);
  d.eval_fraction = 0.1;
  EXPECT_NE(error_message_of([&] { make_datasets(d, lm_model("gpt", 16, 255)); }).find("model.vocab_size"),
            std::string::npos);
}

TEST(TextDataset, BertMasking) {
  TempDir dir;
  const std::string corpus = pattern_corpus(40000);
  lt::data::DataConfig d;
  d.kind = "text";
  d.path = dir.file("corpus.txt", corpus);
  d.mask_prob = 0.15;
  EXPECT_THROW(make_datasets(d, lm_model("bert", 64, 256)), lt::ConfigError);  // no room for [MASK]
  const auto ds = make_datasets(d, lm_model("bert", 64, 257));
  const int64_t n = ds.train->size();
  const Batch b = ds.train->get(iota(n), 2);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{n, 64}));
  EXPECT_EQ(b.tokens, n * 64);
  int64_t chosen = 0, masked = 0, kept = 0, total = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto x = row(b.input, i), y = row(b.target, i);
    int64_t chosen_here = 0;
    for (int64_t t = 0; t < 64; ++t) {
      const int64_t orig = static_cast<unsigned char>(corpus[static_cast<size_t>(i * 64 + t)]);
      ++total;
      if (y[t] == kIgnoreIndex) {
        EXPECT_EQ(x[t], orig) << "sample " << i << " pos " << t;  // not chosen: untouched
        continue;
      }
      ++chosen;
      ++chosen_here;
      EXPECT_EQ(y[t], orig);
      EXPECT_GE(x[t], 0);
      EXPECT_LE(x[t], kTextMaskToken);
      if (x[t] == kTextMaskToken) ++masked;
      if (x[t] == orig) ++kept;
    }
    EXPECT_GE(chosen_here, 1) << "sample " << i;
  }
  const double p = static_cast<double>(chosen) / static_cast<double>(total);
  EXPECT_NEAR(p, 0.15, 0.02) << chosen << " of " << total;
  EXPECT_NEAR(static_cast<double>(masked) / chosen, 0.8, 0.04);
  EXPECT_NEAR(static_cast<double>(kept) / chosen, 0.1, 0.04);  // 10% unchanged (+ rare random = orig)
}

TEST(TextDataset, BertMaskDependsOnlyOnSeedEpochIndex) {
  TempDir dir;
  lt::data::DataConfig d;
  d.kind = "text";
  d.path = dir.file("corpus.txt", pattern_corpus(5000));
  const auto ds = make_datasets(d, lm_model("bert", 32, 257));
  const Batch a = ds.train->get({5, 7}, 1);
  const Batch b = ds.train->get({7}, 1);
  EXPECT_EQ(row(a.input, 1), row(b.input, 0));
  EXPECT_EQ(row(a.target, 1), row(b.target, 0));
  const Batch again = ds.train->get({5, 7}, 1);
  EXPECT_TRUE(torch::equal(a.input, again.input));
  EXPECT_TRUE(torch::equal(a.target, again.target));
  // Another epoch re-draws the mask (over 20 samples at least one differs).
  const auto idx = iota(20);
  EXPECT_FALSE(torch::equal(ds.train->get(idx, 1).target, ds.train->get(idx, 2).target));
  // Another seed too.
  lt::data::DataConfig d2 = d;
  d2.seed = d.seed + 1;
  EXPECT_FALSE(torch::equal(make_datasets(d2, lm_model("bert", 32, 257)).train->get(idx, 1).target,
                            ds.train->get(idx, 1).target));
}

// ------------------------------------------------------------------------------------------------
// make_datasets: pairing and path errors

TEST(MakeDatasets, ConfigErrorsNameTheKey) {
  lt::data::DataConfig d;  // fashion_mnist by default
  lt::models::ModelConfig gpt = lm_model("gpt", 16, 256);
  EXPECT_THROW(make_datasets(d, gpt), lt::ConfigError);
  // Data and model meet through the contract: the message says what each side has.
  const std::string pairing = error_message_of([&] { make_datasets(d, gpt); });
  EXPECT_NE(pairing.find("data.kind = 'fashion_mnist' gives images [B,1,28,28]"), std::string::npos) << pairing;
  EXPECT_NE(pairing.find("the model takes tokens [B,16]"), std::string::npos) << pairing;

  lt::models::ModelConfig mlp;
  mlp.kind = "mlp";
  lt::data::DataConfig missing = d;
  missing.path = "/nonexistent/lt-fashion";
  EXPECT_THROW(make_datasets(missing, mlp), lt::ConfigError);
  const std::string msg = error_message_of([&] { make_datasets(missing, mlp); });
  EXPECT_NE(msg.find("data.path"), std::string::npos) << msg;
  EXPECT_NE(msg.find("/nonexistent/lt-fashion"), std::string::npos) << msg;

  lt::data::DataConfig text;
  text.kind = "text";
  text.path = "/nonexistent/corpus.txt";
  EXPECT_NE(error_message_of([&] { make_datasets(text, gpt); }).find("data.path"), std::string::npos);
  EXPECT_NE(error_message_of([&] { make_datasets(text, mlp); }).find("the model takes images [B,1,28,28]"),
            std::string::npos);

  lt::models::ModelConfig rgb = mlp;
  rgb.in_channels = 3;
  EXPECT_NE(error_message_of([&] { make_datasets(d, rgb); }).find("model.in_channels"), std::string::npos);
  lt::models::ModelConfig classes = mlp;
  classes.num_classes = 100;
  EXPECT_NE(error_message_of([&] { make_datasets(d, classes); }).find("model.num_classes"), std::string::npos);

  lt::data::DataConfig bad_kind = d;
  bad_kind.kind = "imagenet";
  EXPECT_NE(error_message_of([&] { make_datasets(bad_kind, mlp); }).find("data.kind"), std::string::npos);
}

TEST(MakeDatasets, FashionMnist) {
  if (!path_exists(kFashion)) GTEST_SKIP() << kFashion << " not installed";
  lt::data::DataConfig d;
  d.path = kFashion;
  lt::models::ModelConfig m;
  m.kind = "resnet";
  const auto ds = make_datasets(d, m, 1000);
  EXPECT_EQ(ds.train->size(), 1000);
  EXPECT_EQ(ds.eval->size(), 10000);
  EXPECT_NE(ds.eval->describe().find("10000 images 1x28x28, 10 classes"), std::string::npos)
      << ds.eval->describe();
  const Batch b = ds.train->get({0, 1}, 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(b.input.scalar_type(), torch::kFloat);
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{2}));
  EXPECT_EQ(b.target.scalar_type(), torch::kLong);
  EXPECT_EQ(b.target[0].item<int64_t>(), 9);
  EXPECT_EQ(b.tokens, 0);
  // Corner pixels are background (0): normalized to -0.2860/0.3530.
  EXPECT_NEAR(b.input[0][0][0][0].item<float>(), -0.2860 / 0.3530, 1e-5);
  EXPECT_NEAR(b.input.max().item<float>(), (1.0 - 0.2860) / 0.3530, 0.3);
  EXPECT_THROW(ds.train->get({1000}, 0), std::out_of_range);
}

// ------------------------------------------------------------------------------------------------
// Synthetic datasets

TEST(Synthetic, LanguageModels) {
  lt::data::DataConfig d;
  d.kind = "synthetic";
  d.synthetic_samples = 100;
  const auto gpt = make_datasets(d, lm_model("gpt", 32, 50));
  EXPECT_EQ(gpt.train->size(), 100);
  EXPECT_EQ(gpt.eval->size(), 64);  // max(100/8, 64)
  const Batch b = gpt.train->get(iota(10), 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{10, 32}));
  EXPECT_EQ(b.tokens, 320);
  EXPECT_GE(b.input.min().item<int64_t>(), 0);
  EXPECT_LT(b.input.max().item<int64_t>(), 50);
  EXPECT_TRUE(torch::equal(b.input.slice(1, 1), b.target.slice(1, 0, 31)));  // shifted by one
  // Learnable: within a sample the next token is a function of the current one.
  for (int64_t i = 0; i < 10; ++i) {
    const auto x = row(b.input, i), y = row(b.target, i);
    std::vector<int64_t> next(50, -1);
    for (int64_t t = 0; t < 32; ++t) {
      if (next[x[t]] >= 0) EXPECT_EQ(next[x[t]], y[t]);
      next[x[t]] = y[t];
    }
  }
  EXPECT_TRUE(torch::equal(b.input, gpt.train->get(iota(10), 5).input));  // pure function of (seed, index)
  EXPECT_FALSE(torch::equal(b.input, gpt.eval->get(iota(10), 0).input));  // eval is a different stream

  d.synthetic_samples = 1000;
  const auto bert = make_datasets(d, lm_model("bert", 32, 50), 10);
  EXPECT_EQ(bert.train->size(), 10);
  EXPECT_EQ(bert.eval->size(), 125);
  const Batch m = bert.train->get(iota(10), 0);
  EXPECT_LE(m.input.max().item<int64_t>(), 49);  // [MASK] = vocab_size - 1
  EXPECT_TRUE((m.input == 49).any().item<bool>());
  EXPECT_TRUE((m.target == kIgnoreIndex).any().item<bool>());
  EXPECT_LT(m.target.max().item<int64_t>(), 49);
}

TEST(Synthetic, Images) {
  lt::data::DataConfig d;
  d.kind = "synthetic";
  d.synthetic_samples = 1000;
  lt::models::ModelConfig m;
  m.kind = "resnet";
  m.in_channels = 3;
  m.image_size = 32;
  m.num_classes = 10;
  const auto ds = make_datasets(d, m);
  EXPECT_EQ(ds.train->size(), 1000);
  EXPECT_EQ(ds.eval->size(), 125);
  const Batch b = ds.train->get(iota(200), 0);
  EXPECT_EQ(b.input.sizes(), (std::vector<int64_t>{200, 3, 32, 32}));
  EXPECT_EQ(b.input.scalar_type(), torch::kFloat);
  EXPECT_EQ(b.target.sizes(), (std::vector<int64_t>{200}));
  EXPECT_NEAR(b.input.mean().item<float>(), 0.0, 0.02);
  EXPECT_NEAR(b.input.std().item<float>(), 1.0, 0.02);
  std::set<int64_t> labels;
  for (int64_t i = 0; i < 200; ++i) labels.insert(b.target[i].item<int64_t>());
  EXPECT_GE(labels.size(), 8u);
  EXPECT_GE(*labels.begin(), 0);
  EXPECT_LT(*labels.rbegin(), 10);
  const Batch again = ds.train->get({3, 1}, 7);
  EXPECT_TRUE(torch::equal(again.input[0], b.input[3]));
  EXPECT_TRUE(torch::equal(again.target[1], b.target[1]));

  lt::models::ModelConfig mlp = m;
  mlp.kind = "mlp";
  mlp.in_channels = 1;
  mlp.image_size = 28;
  d.synthetic_samples = 16;
  const auto small = make_datasets(d, mlp);
  EXPECT_EQ(small.eval->size(), 64);
  EXPECT_EQ(small.train->get({0}, 0).input.sizes(), (std::vector<int64_t>{1, 1, 28, 28}));
}
