#pragma once
// The model registry: model kinds by name, each with its options table, its input contract
// and its factory. [model] kind = "<name>" in a config picks one; the built-in kinds (gpt,
// bert, resnet, mlp) are registered on first use, a user's kinds by register_model() before
// the config is resolved (examples/custom_model). Nothing outside a kind's own files names it.
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leantrain/models/attention_memory.h"
#include "leantrain/models/foreign_weights.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/contract.h"
#include "leantrain/runtime/options.h"

namespace lt::models {

struct ModelKind {
  std::string name;
  std::string doc;       // one paragraph for `leantrain options` and docs/CONFIG.md
  OptionTable options;   // the [model] keys of this kind
  /// Checks across keys after each option's own rule (e.g. d_model divisible by n_head);
  /// throws lt::ConfigError naming model.<key>. May be empty.
  std::function<void(const Options&)> check;
  /// What the model's forward takes and its loss compares against, from resolved options.
  std::function<InputContract(const Options&)> contract;
  /// The model, from resolved options, on the CPU in fp32 (seed torch first for
  /// reproducible weights).
  std::function<std::shared_ptr<Model>(const Options&)> build;
  /// Optional (foreign_weights.h): another library's weights (a Hugging Face directory's
  /// tensors + config.json, a torchvision state dict) in this kind's names and layouts, for
  /// --init-from. Throws lt::DataError naming the source and listing every disagreement of
  /// its config with the options and every tensor it cannot place. Empty: the kind reads
  /// only its own names.
  std::function<ImportedWeights(const Options&, const ForeignWeights&)> import_weights;
  /// Optional: the inverse, for `leantrain export --format hf`: this kind's tensors (its
  /// named_parameters() and named_buffers()) in the other library's names, with its config.
  /// Throws lt::ConfigError when these options have no counterpart there.
  std::function<ExportedWeights(const Options&, const NamedTensors&)> export_weights;
  /// Optional: the options another library's model directory implies, for `--init-from DIR`
  /// with a config that leaves them unset. Given the [model] options the user's config sets
  /// (`given`, unresolved) and the text of DIR/config.json (`source` = DIR, for messages),
  /// returns `given` with every option config.json determines filled in where `given` lacks it
  /// (and options config.json says nothing of, such as seq_len, derived where the kind's
  /// default cannot hold, e.g. capped at the positions the model has). A given value that
  /// disagrees with config.json is an lt::DataError listing every such key with both values.
  /// std::nullopt: config.json names an architecture this kind does not read (another kind
  /// may). lt::DataError: it names one the kind reads, in a form leantrain cannot represent
  /// (an unimplemented RoPE scaling, heads not divisible by key/value heads, ...), naming the
  /// key. trainers::model_section_for_init (trainers/pretrained.h) applies it before the
  /// config is resolved, and picks the kind when model.kind is unset. Empty: the options come
  /// from the config only.
  std::function<std::optional<Options>(const Options& given, const std::string& config_json,
                                       const std::string& source)>
      options_from_foreign;
  /// Optional (attention_memory.h): the [B,H,T,T] bytes per sample the model's attention cores
  /// hold in a training step on a device, with activations of a dtype, under a recompute
  /// policy — the planner's analytic attention term. Empty: the kind has no attention (0).
  std::function<AttentionMemory(const Options&, const c10::Device&, c10::ScalarType, const RecomputePolicy&)>
      attention_memory;
};

/// Adds a kind. Throws std::invalid_argument if the name is empty or taken, or contract or
/// build is missing. Thread-safe; call it before resolving configs that name the kind.
void register_model(ModelKind kind);
/// The kind registered under `name`; ConfigError "model.kind = ..." listing the registered
/// names when there is none.
const ModelKind& model_kind(const std::string& name);
/// The registered names, in registration order (the built-ins first).
std::vector<std::string> model_kind_names();
/// The kind an empty model.kind means: "mlp".
const std::string& default_model_kind();

/// `section` with its kind named (the default if empty) and its options resolved against the
/// kind's table: defaults filled, each rule and the kind's check run. ConfigError naming the
/// key otherwise.
ModelSection resolve_model(const ModelSection& section);
/// The contract and the model of a section (resolved first).
InputContract model_contract(const ModelSection& section);
std::shared_ptr<Model> build_model(const ModelSection& section);
/// The kind's attention term (ModelKind::attention_memory) for a resolved section; a default
/// AttentionMemory (no attention, 0 bytes) for a kind without one.
AttentionMemory attention_memory(const ModelSection& section, const c10::Device& device, c10::ScalarType dtype,
                                 const RecomputePolicy& policy);

/// The section of a built-in kind's struct (the options of cfg.kind's table). For tests and
/// tools that speak ModelConfig.
ModelSection builtin_model_section(const ModelConfig& cfg);
/// The contract of a built-in model config.
InputContract model_contract(const ModelConfig& cfg);

}  // namespace lt::models
