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

/// The [model] section of a run that starts from `init_from` (--init-from), before the
/// config is resolved. When `init_from` is a Hugging Face directory whose config.json a kind
/// reads (ModelKind::options_from_foreign): `given` with every option config.json determines
/// filled in where `given` leaves it unset (a set value that disagrees: lt::DataError naming
/// each key with both values), and model.kind set to that kind when `given` leaves it unset;
/// a model.kind set to another kind is a ConfigError saying which kind to set. Then (or for
/// any other directory) config.json is checked by the kind's import before a model is built
/// (no tensors read). Anything else (a checkpoint, a safetensors file): `given` unchanged.
/// `notes` gets what was filled in.
ModelSection model_section_for_init(const ModelSection& given, const std::string& init_from,
                                   std::vector<std::string>* notes = nullptr);

/// The shards of an export: indices into `tensors`, in order, each shard holding at most
/// `max_shard_bytes` of tensor data unless one tensor alone is bigger (it gets a shard of its
/// own); 0: one shard. As huggingface_hub's split_torch_state_dict_into_shards.
std::vector<std::vector<size_t>> shard_plan(const std::vector<checkpoint_io::NamedTensor>& tensors,
                                            int64_t max_shard_bytes);

/// How `leantrain export` writes.
struct ExportOptions {
  /// fp32 | bf16 | fp16: the floating-point tensors' dtype in the files (the checkpoint is fp32).
  std::string dtype = "fp32";
  /// --format hf: above this many bytes of tensors the weights go into shards
  /// model-0000i-of-0000n.safetensors with model.safetensors.index.json, as save_pretrained
  /// writes them (no tensor split; one bigger than this gets a shard of its own); 0: always
  /// one model.safetensors. Default 5 GB, the size models on the Hugging Face Hub are
  /// sharded at (transformers 4.x's default).
  int64_t max_shard_bytes = 5'000'000'000;
  /// --format hf: the Hugging Face directory the model was initialised from (--init-from).
  /// Its tokenizer files and generation_config.json are copied, and its config.json's keys
  /// the export leaves out or null (bos/eos/pad token ids, ...) kept, when it is of the same
  /// model_type. Empty: none.
  std::string source;
};

/// `leantrain export CHECKPOINT --format safetensors|hf --out DIR`: the checkpoint's model
/// weights (verified against its model config) into DIR/model.safetensors: "safetensors" in
/// leantrain's names with the model config in the metadata (leantrain.model_config,
/// leantrain.kind); "hf" in the kind's other library's names (export_weights) with its
/// config.json when it has one, sharded as `opt` says. Everything is converted before
/// anything is written; each file is written atomically and a failure removes what this call
/// wrote; weight files of an earlier export in DIR that this one did not write (a single file
/// where shards are written now, or shards of another count) are removed after it succeeds.
/// Returns the files written. Throws ConfigError (bad format or options, a kind without
/// export), CheckpointError (bad checkpoint), DataError (an unreadable --source),
/// lt::StorageError (DIR not writable).
std::vector<std::string> export_weights(const std::string& checkpoint, const std::string& format,
                                        const std::string& out_dir, std::vector<std::string>* notes = nullptr,
                                        const ExportOptions& opt = {});

}  // namespace lt::trainers
