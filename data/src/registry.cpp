// The data registry and the built-in kinds' entries (their options bound to DataConfig).
#include "leantrain/data/registry.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <stdexcept>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"

namespace lt::data {
namespace {

using Bound = BoundOptions<DataConfig>;

OptionRule non_empty() {
  return {"not empty", [](const OptionValue& v) -> std::string {
            return std::get<std::string>(v).empty() ? "give a path" : "";
          }};
}

const OptionRule kMaskProb = rules::in_range(0, false, 1, true);

Bound fashion_options() {
  Bound b;
  b.add("path", &DataConfig::path,
        "directory holding train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz] (Debian's dataset-fashion-mnist)",
        non_empty());
  return b;
}

Bound text_options() {
  Bound b;
  b.add("path", &DataConfig::path, "a text file, or a directory of them (read in name order)", non_empty())
      .add("eval_fraction", &DataConfig::eval_fraction,
           "share of the corpus, at its end, held out for evaluation; 0: no evaluation",
           rules::in_range(0, true, 1, false))
      .add("mask_prob", &DataConfig::mask_prob, "masked-token targets: share of positions masked", kMaskProb);
  b.set_default("path", std::string("/usr/share/games/fortunes"));
  return b;
}

Bound synthetic_options() {
  Bound b;
  b.add("synthetic_samples", &DataConfig::synthetic_samples,
        "training samples (eval: max(synthetic_samples / 8, 64))", rules::at_least(1))
      .add("mask_prob", &DataConfig::mask_prob, "masked-token targets: share of positions masked", kMaskProb);
  return b;
}

DataKind builtin(const std::string& name, std::string doc, Bound bound) {
  DataKind k;
  k.name = name;
  k.doc = std::move(doc);
  k.options = bound.table();
  k.make = [name, bound](const Options& o, uint64_t seed, const InputContract& model) {
    DataConfig c = bound.read(o);
    c.kind = name;
    c.seed = seed;
    return make_datasets(c, model);
  };
  return k;
}

struct Registry {
  std::mutex mu;
  std::deque<DataKind> kinds;  // push_back keeps references to the others valid
  Registry() {
    kinds.push_back(builtin("fashion_mnist",
                            "Fashion-MNIST from IDX files: images [B,1,28,28] normalised, labels of 10 classes; "
                            "train = train-*, eval = t10k-* (the default kind).",
                            fashion_options()));
    kinds.push_back(builtin("text",
                            "Byte-level text: non-overlapping windows of the model's seq_len + 1 bytes; next-token "
                            "or masked-token targets ([MASK] = 256), as the model's contract asks.",
                            text_options()));
    kinds.push_back(builtin("synthetic",
                            "Generated samples, a pure function of (seed, index): token sequences following one "
                            "of 4 affine rules, or images labelled by a fixed random template, to the model's "
                            "contract.",
                            synthetic_options()));
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

const Bound& builtin_bound(const std::string& kind) {
  static const Bound fashion = fashion_options(), text = text_options(), synthetic = synthetic_options();
  if (kind == "fashion_mnist") return fashion;
  if (kind == "text") return text;
  if (kind == "synthetic") return synthetic;
  throw ConfigError("data.kind = \"" + kind + "\": not a built-in kind (fashion_mnist | text | synthetic)");
}

// The given options without the keys of the section's other kinds (a config switched to
// `kind` with --set), each dropped key logged once.
Options own_options(const std::string& kind, const OptionTable& table, const Options& given) {
  std::vector<std::pair<std::string, const OptionTable*>> others;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& k : r.kinds)
      if (k.name != kind) others.emplace_back(k.name, &k.options);
  }
  std::vector<std::string> dropped;
  Options own = without_other_kinds_keys("data", table, others, given, &dropped);
  for (const auto& d : dropped) log::info("ignoring " + d + ": data.kind is " + kind);
  return own;
}

}  // namespace

void register_data(DataKind kind) {
  if (kind.name.empty()) throw std::invalid_argument("register_data: the kind needs a name");
  if (!kind.make) throw std::invalid_argument("register_data(\"" + kind.name + "\"): give make");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& k : r.kinds)
    if (k.name == kind.name) throw std::invalid_argument("register_data: \"" + kind.name + "\" is already registered");
  r.kinds.push_back(std::move(kind));
}

const DataKind& data_kind(const std::string& name) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::string names;
  for (const auto& k : r.kinds) {
    if (k.name == name) return k;
    names += (names.empty() ? "" : " | ") + k.name;
  }
  throw ConfigError("data.kind = \"" + name + "\": no such data kind; registered: " + names);
}

std::vector<std::string> data_kind_names() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> out;
  for (const auto& k : r.kinds) out.push_back(k.name);
  return out;
}

const std::string& default_data_kind() {
  static const std::string kind = "fashion_mnist";
  return kind;
}

DataSection resolve_data(const DataSection& section) {
  DataSection out = section;
  out.kind = section.kind.empty() ? default_data_kind() : section.kind;
  const OptionTable& table = data_kind(out.kind).options;
  out.options = resolve_options("data", out.kind, table, own_options(out.kind, table, section.options));
  return out;
}

Datasets make_datasets(const DataSection& section, const InputContract& model) {
  const DataSection s = resolve_data(section);
  Datasets d = data_kind(s.kind).make(s.options, s.seed, model);
  if (!d.train) throw ConfigError("data.kind = \"" + s.kind + "\" built no training set");
  for (const auto& field : model.fields) {
    const auto have = d.train->fields();
    if (std::find(have.begin(), have.end(), field) == have.end())
      throw ConfigError("the model reads the input field \"" + field + "\", which data.kind = \"" + s.kind +
                        "\" does not give (" + d.train->describe() + ")");
  }
  d.train = first_samples(d.train, s.limit);
  return d;
}

DataConfig builtin_data_config(const DataSection& section) {
  const DataSection s = resolve_data(section);
  DataConfig c = builtin_bound(s.kind).read(s.options);
  c.kind = s.kind;
  c.seed = s.seed;
  return c;
}

DataSection builtin_data_section(const DataConfig& cfg) {
  DataSection s;
  s.kind = cfg.kind;
  s.seed = cfg.seed;
  s.options = builtin_bound(cfg.kind).write(cfg);
  return s;
}

}  // namespace lt::data
