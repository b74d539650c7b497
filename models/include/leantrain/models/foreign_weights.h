#pragma once
// Weights in another library's names and layouts: Hugging Face transformers (GPT2LMHeadModel,
// BertForMaskedLM) and torchvision (ResNet). A model kind that has such a counterpart gives
// its registry entry an import and an export (registry.h, ModelKind::import_weights /
// export_weights), so the layers above (trainers/, launch/) read and write pretrained weights
// without naming a kind. The built-in kinds' mappings live in models/src/foreign_weights.cpp,
// each listed at the top of its section there.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace lt::models {

/// Named tensors in a fixed order.
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

/// A state dict in the other library's names, with that library's config.
struct ForeignWeights {
  NamedTensors tensors;
  /// The text of a Hugging Face model directory's config.json; empty for a bare state dict (a
  /// safetensors file, e.g. torchvision's converted by tools/torchvision_to_safetensors.py).
  std::string config_json;
  std::string source;  // the file or directory, for messages
};

/// The same weights in the kind's own names and layouts (named_parameters() and
/// named_buffers()). Shapes are not yet checked against the model: the caller does that
/// (checkpoint_io::check_model), listing every mismatch, so that --init-skip-mismatched can
/// skip a new head.
struct ImportedWeights {
  NamedTensors tensors;
  std::string format;               // what was read, e.g. "Hugging Face GPT2LMHeadModel"
  std::vector<std::string> notes;   // what the conversion did (logged): ignored buffers, cropped positions
};

/// The kind's weights in the other library's names and layouts.
struct ExportedWeights {
  NamedTensors tensors;
  /// config.json for a Hugging Face directory; empty when the library has none (torchvision).
  std::string config_json;
  std::map<std::string, std::string> metadata;  // safetensors __metadata__ ({"format": "pt"})
  std::string format;                           // e.g. "Hugging Face GPT2LMHeadModel"
  std::vector<std::string> notes;
};

}  // namespace lt::models
