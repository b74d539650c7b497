#pragma once
// The data registry: data kinds by name, each with its options table and a factory that builds
// train/eval sets to a model's input contract. [data] kind = "<name>" picks one; the built-in
// kinds (fashion_mnist, text, synthetic) are registered on first use, a user's by
// register_data() before the config is resolved.
#include <functional>
#include <string>
#include <vector>

#include "leantrain/data/dataset.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/contract.h"
#include "leantrain/runtime/options.h"

namespace lt::data {

struct DataKind {
  std::string name;
  std::string doc;      // one paragraph for `leantrain options` and docs/CONFIG.md
  OptionTable options;  // the [data] keys of this kind (besides kind, seed and limit)
  /// Train and eval sets (eval may be null: no evaluation) for `model`, from resolved options
  /// and data.seed. Refuses a contract it cannot serve with lt::ConfigError naming what the
  /// model takes and what the data gives, before reading anything.
  std::function<Datasets(const Options& options, uint64_t seed, const InputContract& model)> make;
};

/// Adds a kind. Throws std::invalid_argument if the name is empty or taken, or make is
/// missing. Thread-safe.
void register_data(DataKind kind);
/// The kind registered under `name`; ConfigError listing the registered names otherwise.
const DataKind& data_kind(const std::string& name);
std::vector<std::string> data_kind_names();
/// The kind an empty data.kind means: "fashion_mnist".
const std::string& default_data_kind();

/// `section` with its kind named and its options resolved against the kind's table.
DataSection resolve_data(const DataSection& section);
/// The datasets of a section for a model (resolved first); data.limit > 0 keeps the first
/// `limit` training samples (first_samples). A model's contract fields missing from the
/// training set's Dataset::fields() are a ConfigError.
Datasets make_datasets(const DataSection& section, const InputContract& model);

}  // namespace lt::data
