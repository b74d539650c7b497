#pragma once
// Pretrained weights in and out, for any model kind: `--init-from` (a leantrain checkpoint, a
// safetensors file, a Hugging Face model directory) and `leantrain export`. Another
// library's names are the kind's business (models/foreign_weights.h, ModelKind::import_weights
// / export_weights); this file only finds the files and checks the result against the model.
#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/runtime/config.h"

namespace lt::trainers {

/// Weights for a model, in its own names, with what they came from.
struct InitWeights {
  std::vector<checkpoint_io::NamedTensor> tensors;
  std::string description;         // e.g. "checkpoint step 100", "Hugging Face GPT2LMHeadModel"
  std::vector<std::string> notes;  // what a conversion did (ignored buffers, cropped positions)
};

/// Reads `path` as weights for a model of `section` (resolved) whose tensors are `expected`:
///  - a leantrain checkpoint (.h5, recognised by its HDF5 signature);
///  - a .safetensors file: in leantrain's names when `leantrain export --format safetensors`
///    wrote it (its metadata says so) or when most of its names are the model's; otherwise in
///    another library's names, converted by the kind's import_weights (torchvision for resnet);
///  - a directory with config.json and model.safetensors (or shards listed in
///    model.safetensors.index.json): a Hugging Face model, converted by the kind's import.
/// Floating-point tensors are converted to the model's dtype (fp16/bf16 files). Names and
/// shapes are not checked here (see init_model). Throws lt::DataError / CheckpointError /
/// ConfigError naming the file.
InitWeights read_init_weights(const std::string& path, const ModelSection& section,
                              const std::vector<checkpoint_io::NamedTensor>& expected);

struct InitResult {
  int64_t loaded = 0;
  std::vector<std::string> skipped;  // "name (checkpoint [..], model [..])", with skip_mismatched
  std::string description;
  std::vector<std::string> notes;
};

/// read_init_weights, then every name and shape checked against `model`'s parameters and
/// buffers (checkpoint_io::check_model: all mismatches listed, nothing copied when any),
/// then copied in. `skip_mismatched` skips tensors whose shapes differ (a new head).
InitResult init_model(const std::string& path, const ModelSection& section, torch::nn::Module& model,
                      bool skip_mismatched);

/// The [model] section a checkpoint was trained with (its model_config JSON, checked by the
/// config parser and the kind's table).
ModelSection checkpoint_model_section(const checkpoint_io::Checkpoint& c, const std::string& path);

/// `leantrain export CHECKPOINT --format safetensors|hf --out DIR`: the checkpoint's model
/// weights (verified against its model config) into DIR/model.safetensors: "safetensors" in
/// leantrain's names with the model config in the metadata (leantrain.model_config,
/// leantrain.kind); "hf" in the kind's other library's names (export_weights) with its
/// config.json when it has one. Everything is converted before anything is written; each
/// file is written atomically and a failure removes what this call wrote. Returns the files
/// written. Throws ConfigError (bad format, a kind without export), CheckpointError (bad
/// checkpoint), lt::StorageError (DIR not writable).
std::vector<std::string> export_weights(const std::string& checkpoint, const std::string& format,
                                        const std::string& out_dir, std::vector<std::string>* notes = nullptr);

}  // namespace lt::trainers
