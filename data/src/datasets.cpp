// The datasets and make_datasets: the only part of the data layer that includes LibTorch.
// File parsing and per-sample generation live in torch-free TUs (idx.cpp, text.cpp, samples.cpp).
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>

#include "leantrain/data/dataset.h"
#include "leantrain/data/readers.h"
#include "leantrain/runtime/errors.h"
#include "rng.h"
#include "lm_batch.h"
#include "samples.h"

namespace lt::data {

void detail::check_indices(const std::vector<int64_t>& indices, int64_t size, const std::string& name) {
  for (int64_t i : indices) {
    if (i < 0 || i >= size) {
      throw std::out_of_range(name + ": sample index " + std::to_string(i) + " outside [0, " +
                              std::to_string(size) + ")");
    }
  }
}

Batch detail::lm_batch(const std::vector<int64_t>& indices, int64_t epoch, int64_t size, const std::string& name,
                       const LmSpec& spec, const std::function<void(int64_t, int64_t*)>& window_of) {
  check_indices(indices, size, name);
  const auto B = static_cast<int64_t>(indices.size());
  const int64_t T = spec.seq_len;
  Batch b;
  b.input = torch::empty({B, T}, torch::kLong);
  b.target = torch::empty({B, T}, torch::kLong);
  b.tokens = B * T;
  int64_t* x = b.input.data_ptr<int64_t>();
  int64_t* y = b.target.data_ptr<int64_t>();
  std::vector<int64_t> window(static_cast<size_t>(T + 1));
  for (int64_t n = 0; n < B; ++n) {
    window_of(indices[n], window.data());
    int64_t* xi = x + n * T;
    int64_t* yi = y + n * T;
    std::copy(window.begin(), window.begin() + T, xi);
    if (spec.bert) {
      bert_mask(xi, yi, T, spec.seed, epoch, indices[n], spec.mask_prob, spec.mask_token, spec.random_vocab,
                spec.never);
    } else {
      std::copy(window.begin() + 1, window.end(), yi);
    }
  }
  return b;
}

namespace {

using detail::check_indices;
using detail::LmSpec;
using detail::kStreamSynthEval;
using detail::kStreamSynthTrain;


std::string quoted(const std::string& s) { return "'" + s + "'"; }

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST

class IdxImageDataset final : public Dataset {
 public:
  IdxImageDataset(std::string name, IdxImages images, IdxLabels labels)
      : name_(std::move(name)), images_(std::move(images)), labels_(std::move(labels)), size_(images_.count) {
    for (int v = 0; v < 256; ++v) lut_[v] = static_cast<float>((v / 255.0 - 0.2860) / 0.3530);
  }
  int64_t size() const override { return size_; }
  Batch get(const std::vector<int64_t>& indices, int64_t /*epoch*/) const override {
    check_indices(indices, size_, name_);
    const auto B = static_cast<int64_t>(indices.size());
    const int64_t R = images_.rows, C = images_.cols, P = R * C;
    Batch b;
    b.input = torch::empty({B, 1, R, C}, torch::kFloat);
    b.target = torch::empty({B}, torch::kLong);
    float* x = b.input.data_ptr<float>();
    int64_t* y = b.target.data_ptr<int64_t>();
    for (int64_t n = 0; n < B; ++n) {
      const uint8_t* src = images_.pixels.data() + indices[n] * P;
      for (int64_t p = 0; p < P; ++p) x[n * P + p] = lut_[src[p]];
      y[n] = labels_.labels[static_cast<size_t>(indices[n])];
    }
    return b;
  }
  std::string describe() const override {
    return name_ + ": " + std::to_string(size_) + " images 1x" + std::to_string(images_.rows) + "x" +
           std::to_string(images_.cols) + ", 10 classes";
  }

 private:
  std::string name_;
  IdxImages images_;
  IdxLabels labels_;
  int64_t size_;
  float lut_[256];
};

std::shared_ptr<Dataset> load_fashion_split(const std::string& dir, const std::string& split) {
  const std::string img_path = dir + "/" + split + "-images-idx3-ubyte.gz";
  const std::string lbl_path = dir + "/" + split + "-labels-idx1-ubyte.gz";
  IdxImages images = read_idx_images(img_path);
  IdxLabels labels = read_idx_labels(lbl_path);
  if (images.rows != 28 || images.cols != 28) {
    throw lt::DataError("data file " + quoted(img_path) + " holds " + std::to_string(images.rows) + "x" +
                        std::to_string(images.cols) + " images, Fashion-MNIST is 28x28");
  }
  if (images.count != labels.count) {
    throw lt::DataError("data files " + quoted(img_path) + " and " + quoted(lbl_path) + " disagree: " +
                        std::to_string(images.count) + " images, " + std::to_string(labels.count) + " labels");
  }
  for (size_t i = 0; i < labels.labels.size(); ++i) {
    if (labels.labels[i] >= 10) {
      throw lt::DataError("data file " + quoted(lbl_path) + ": label " + std::to_string(labels.labels[i]) +
                          " of sample " + std::to_string(i) + " is not in 0..9");
    }
  }
  const std::string name = std::string("fashion_mnist ") + (split == "train" ? "train" : "eval");
  return std::make_shared<IdxImageDataset>(name, std::move(images), std::move(labels));
}

// ---------------------------------------------------------------------------------------------
// Language modelling: byte-level text and synthetic token rules share the batch layout.

class LmDataset : public Dataset {
 public:
  LmDataset(LmSpec spec, int64_t size) : spec_(spec), size_(size) {}
  int64_t size() const override { return size_; }
  Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override {
    return detail::lm_batch(indices, epoch, size_, name(), spec_,
                            [this](int64_t i, int64_t* out) { window_of(i, out); });
  }

 protected:
  virtual std::string name() const = 0;
  /// Writes the seq_len+1 tokens of sample i.
  virtual void window_of(int64_t i, int64_t* out) const = 0;
  LmSpec spec_;
  int64_t size_;
};

class TextDataset final : public LmDataset {
 public:
  TextDataset(std::string name, std::string path, std::shared_ptr<const std::string> corpus, size_t begin,
              size_t bytes, LmSpec spec)
      : LmDataset(spec, static_cast<int64_t>((bytes - 1) / static_cast<size_t>(spec.seq_len))),
        name_(std::move(name)), path_(std::move(path)), corpus_(std::move(corpus)), begin_(begin), bytes_(bytes) {}
  std::string describe() const override {
    char mb[32];
    std::snprintf(mb, sizeof mb, "%.2f MB", static_cast<double>(bytes_) / 1e6);
    return name_ + ": " + std::to_string(size_) + " windows of " + std::to_string(spec_.seq_len) +
           "+1 bytes from " + quoted(path_) + " (" + mb + ")" +
           (spec_.bert ? ", masked-LM p=" + std::to_string(spec_.mask_prob).substr(0, 4) : ", next-byte");
  }

 protected:
  std::string name() const override { return name_; }
  void window_of(int64_t i, int64_t* out) const override {
    const auto* p = reinterpret_cast<const unsigned char*>(corpus_->data()) + begin_ +
                    static_cast<size_t>(i * spec_.seq_len);
    for (int64_t t = 0; t <= spec_.seq_len; ++t) out[t] = p[t];
  }

 private:
  std::string name_, path_;
  std::shared_ptr<const std::string> corpus_;
  size_t begin_, bytes_;
};

class SyntheticLmDataset final : public LmDataset {
 public:
  SyntheticLmDataset(std::string name, uint64_t stream, int64_t size, LmSpec spec, int64_t vocab)
      : LmDataset(spec, size), name_(std::move(name)), stream_(stream), rules_(spec.seed, vocab) {}
  std::string describe() const override {
    return name_ + ": " + std::to_string(size_) + " sequences of " + std::to_string(spec_.seq_len) +
           " tokens, vocab " + std::to_string(rules_.vocab) + (spec_.bert ? " (+[MASK])" : "");
  }

 protected:
  std::string name() const override { return name_; }
  void window_of(int64_t i, int64_t* out) const override {
    rules_.sample(out, spec_.seq_len + 1, spec_.seed, stream_, i);
  }

 private:
  std::string name_;
  uint64_t stream_;
  detail::TokenRules rules_;
};

// ---------------------------------------------------------------------------------------------
// Synthetic images

class SyntheticImageDataset final : public Dataset {
 public:
  SyntheticImageDataset(std::string name, uint64_t stream, int64_t size, uint64_t seed,
                        std::shared_ptr<const detail::ImageTemplates> templates)
      : name_(std::move(name)), stream_(stream), size_(size), seed_(seed), templates_(std::move(templates)) {}
  int64_t size() const override { return size_; }
  Batch get(const std::vector<int64_t>& indices, int64_t /*epoch*/) const override {
    check_indices(indices, size_, name_);
    const auto B = static_cast<int64_t>(indices.size());
    const int64_t C = templates_->channels, S = templates_->size, P = C * S * S;
    Batch b;
    b.input = torch::empty({B, C, S, S}, torch::kFloat);
    b.target = torch::empty({B}, torch::kLong);
    float* x = b.input.data_ptr<float>();
    int64_t* y = b.target.data_ptr<int64_t>();
    for (int64_t n = 0; n < B; ++n) y[n] = templates_->sample(x + n * P, seed_, stream_, indices[n]);
    return b;
  }
  std::string describe() const override {
    return name_ + ": " + std::to_string(size_) + " images " + std::to_string(templates_->channels) + "x" +
           std::to_string(templates_->size) + "x" + std::to_string(templates_->size) + ", " +
           std::to_string(templates_->classes) + " classes";
  }

 private:
  std::string name_;
  uint64_t stream_;
  int64_t size_;
  uint64_t seed_;
  std::shared_ptr<const detail::ImageTemplates> templates_;
};

// ---------------------------------------------------------------------------------------------
// make_datasets

[[noreturn]] void config_error(const std::string& key, const std::string& msg) {
  throw lt::ConfigError(key + ": " + msg);
}

using Input = lt::InputContract::Input;
using Target = lt::InputContract::Target;

// "model.in_channels = 3" or "the model's channels = 3" when the model fixes it.
std::string model_value(const std::string& key, const char* what, int64_t v) {
  return (key.empty() ? std::string("the model's ") + what : key) + " = " + std::to_string(v);
}

// Refuses a contract whose value `have` differs from what the data gives.
void require_equal(const std::string& key, const char* what, int64_t have, int64_t want, const std::string& data) {
  if (have == want) return;
  throw lt::ConfigError(model_value(key, what, have) + ", but " + data + " gives " + std::to_string(want) +
                        (key.empty() ? "" : " (set " + key + " = " + std::to_string(want) + ")"));
}

void require_input(const lt::InputContract& m, Input input, const std::string& data_kind, const char* gives) {
  if (m.input == input && (input == Input::kTokens) == (m.target != Target::kClassLabels)) return;
  throw lt::ConfigError("data.kind = " + quoted(data_kind) + " gives " + gives + "; the model takes " + m.describe());
}

struct PathKind {
  bool exists = false, dir = false;
};
PathKind stat_path(const std::string& p) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return {};
  return {true, S_ISDIR(st.st_mode)};
}

Datasets make_fashion_mnist(const DataConfig& d, const lt::InputContract& m) {
  require_input(m, Input::kImages, d.kind, "images [B,1,28,28] with labels of 10 classes");
  require_equal(m.channels_key, "channels", m.channels, 1, "Fashion-MNIST (1 channel)");
  require_equal(m.size_key, "image size", m.height, 28, "Fashion-MNIST (28x28 images)");
  require_equal(m.size_key, "image size", m.width, 28, "Fashion-MNIST (28x28 images)");
  require_equal(m.num_classes_key, "classes", m.num_classes, 10, "Fashion-MNIST (10 classes)");
  const PathKind pk = stat_path(d.path);
  if (!pk.exists) config_error("data.path", quoted(d.path) + " does not exist (fashion_mnist needs the directory holding train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz])");
  if (!pk.dir) config_error("data.path", quoted(d.path) + " is not a directory (fashion_mnist needs the directory holding the 4 IDX files)");
  Datasets out;
  out.train = load_fashion_split(d.path, "train");
  out.eval = load_fashion_split(d.path, "t10k");
  return out;
}

Datasets make_text(const DataConfig& d, const lt::InputContract& m) {
  require_input(m, Input::kTokens, d.kind, "byte tokens with next-token or masked-token targets");
  const bool bert = m.target == Target::kMaskedTokens;
  const int64_t need_vocab = bert ? kTextMaskToken + 1 : 256;
  if (m.vocab_size < need_vocab) {
    throw lt::ConfigError(model_value(m.vocab_size_key, "vocabulary", m.vocab_size) +
                          " is too small for byte-level text: " + (bert ? "masked" : "next-token") +
                          " targets need >= " + std::to_string(need_vocab) +
                          (bert ? " (256 bytes + [MASK])" : " (256 bytes)"));
  }
  if (!stat_path(d.path).exists) {
    config_error("data.path", quoted(d.path) + " does not exist (text needs a text file or a directory of them)");
  }
  auto corpus = std::make_shared<const std::string>(read_text_corpus(d.path));
  const size_t total = corpus->size();
  const auto eval_bytes = static_cast<size_t>(std::floor(static_cast<double>(total) * d.eval_fraction));
  const size_t train_bytes = total - eval_bytes;
  const auto window = static_cast<size_t>(m.seq_len) + 1;
  if (train_bytes < window) {
    throw lt::DataError("text corpus " + quoted(d.path) + " leaves " + std::to_string(train_bytes) +
                        " training bytes, fewer than one window of the model's seq_len+1 = " + std::to_string(window));
  }
  LmSpec spec;
  spec.seq_len = m.seq_len;
  spec.bert = bert;
  spec.mask_prob = d.mask_prob;
  spec.mask_token = kTextMaskToken;
  spec.random_vocab = 256;
  spec.seed = d.seed;
  Datasets out;
  out.train = std::make_shared<TextDataset>("text train", d.path, corpus, 0, train_bytes, spec);
  if (eval_bytes > 0) {
    if (eval_bytes < window) {
      config_error("data.eval_fraction", std::to_string(d.eval_fraction) + " holds out " + std::to_string(eval_bytes) +
                                             " bytes, fewer than one window of the model's seq_len+1 = " +
                                             std::to_string(window) + " (raise it, or 0 for no eval)");
    }
    out.eval = std::make_shared<TextDataset>("text eval", d.path, corpus, train_bytes, eval_bytes, spec);
  }
  return out;
}

Datasets make_synthetic(const DataConfig& d, const lt::InputContract& m) {
  const int64_t train_n = d.synthetic_samples;
  const int64_t eval_n = std::max<int64_t>(d.synthetic_samples / 8, 64);
  Datasets out;
  if (m.input == Input::kTokens) {
    require_input(m, Input::kTokens, d.kind, "tokens with next-token or masked-token targets, or images with labels");
    const bool bert = m.target == Target::kMaskedTokens;
    if (m.vocab_size < (bert ? 3 : 2)) {
      throw lt::ConfigError(model_value(m.vocab_size_key, "vocabulary", m.vocab_size) + ": must be >= " +
                            (bert ? "3 for masked targets (tokens + [MASK])" : "2"));
    }
    const int64_t vocab = bert ? m.vocab_size - 1 : m.vocab_size;  // bert: [MASK] = vocab_size-1
    LmSpec spec;
    spec.seq_len = m.seq_len;
    spec.bert = bert;
    spec.mask_prob = d.mask_prob;
    spec.mask_token = m.vocab_size - 1;
    spec.random_vocab = vocab;
    spec.seed = d.seed;
    out.train = std::make_shared<SyntheticLmDataset>("synthetic train", kStreamSynthTrain, train_n, spec, vocab);
    out.eval = std::make_shared<SyntheticLmDataset>("synthetic eval", kStreamSynthEval, eval_n, spec, vocab);
  } else {
    require_input(m, Input::kImages, d.kind, "tokens with next-token or masked-token targets, or images with labels");
    if (m.height != m.width)
      throw lt::ConfigError("synthetic images are square; the model takes " + m.describe());
    if (m.num_classes < 2)
      throw lt::ConfigError(model_value(m.num_classes_key, "classes", m.num_classes) + ": synthetic labels need >= 2");
    auto templates = std::make_shared<const detail::ImageTemplates>(d.seed, m.channels, m.height, m.num_classes);
    out.train = std::make_shared<SyntheticImageDataset>("synthetic train", kStreamSynthTrain, train_n, d.seed, templates);
    out.eval = std::make_shared<SyntheticImageDataset>("synthetic eval", kStreamSynthEval, eval_n, d.seed, templates);
  }
  return out;
}

}  // namespace

Datasets make_datasets(const DataConfig& data, const lt::InputContract& model) {
  if (data.kind == "fashion_mnist") return make_fashion_mnist(data, model);
  if (data.kind == "text") return make_text(data, model);
  if (data.kind == "synthetic") return make_synthetic(data, model);
  config_error("data.kind", quoted(data.kind) + " is not one of fashion_mnist | text | synthetic");
}

namespace {

class FirstSamples final : public Dataset {
 public:
  FirstSamples(std::shared_ptr<const Dataset> inner, int64_t n) : inner_(std::move(inner)), n_(n) {}
  int64_t size() const override { return n_; }
  Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override {
    for (int64_t i : indices)
      if (i < 0 || i >= n_)
        throw std::out_of_range("the first " + std::to_string(n_) + " samples: index " + std::to_string(i) + " outside");
    return inner_->get(indices, epoch);
  }
  std::string describe() const override {
    return inner_->describe() + "; the first " + std::to_string(n_) + " used (data.limit)";
  }
  std::vector<std::string> fields() const override { return inner_->fields(); }

 private:
  std::shared_ptr<const Dataset> inner_;
  int64_t n_;
};

}  // namespace

std::shared_ptr<Dataset> first_samples(std::shared_ptr<Dataset> data, int64_t n) {
  if (!data || n <= 0 || n >= data->size()) return data;
  return std::make_shared<FirstSamples>(std::move(data), n);
}

}  // namespace lt::data
