#pragma once
// The llama kind's Hugging Face counterparts (foreign_weights_llama.cpp): LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM and MistralForCausalLM directories in and out, bound to
// the kind's registry entry in registry.cpp (ModelKind::import_weights, export_weights,
// options_from_foreign). Each takes the kind's options (registry.h) by their keys, which are
// the names config.json gives them. Private to models/.
#include <optional>
#include <string>

#include "leantrain/models/foreign_weights.h"
#include "leantrain/runtime/options.h"

namespace lt::models {

/// A Hugging Face directory's tensors (and config.json, checked key by key against the
/// resolved options `o`) in the kind's names. DataError for another architecture (naming it
/// and the four it reads), a config.json leantrain cannot represent or that disagrees.
ImportedWeights import_llama(const Options& o, const ForeignWeights& w);

/// The kind's tensors in transformers' names with the config.json of the architecture
/// model.family names. ConfigError when the options have no counterpart in that family (e.g.
/// qk_norm outside qwen3).
ExportedWeights export_llama(const Options& o, const NamedTensors& tensors);

/// ModelKind::options_from_foreign: the options a config.json of the four architectures
/// implies, under the ones the user's config gives (unresolved); std::nullopt for any other.
std::optional<Options> llama_options_from_foreign(const Options& given, const std::string& config_json,
                                                  const std::string& source);

}  // namespace lt::models
