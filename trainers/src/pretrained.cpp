// Pretrained weights in (--init-from) and out (leantrain export), kind-agnostic: another
// library's names are converted by the model kind's hooks (models/foreign_weights.h).
#include "leantrain/trainers/pretrained.h"

#include <torch/torch.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "leantrain/checkpoint_io/safetensors.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/trainers/checkpointing.h"

namespace lt::trainers {
namespace {

using checkpoint_io::NamedTensor;
using json = nlohmann::json;

// Metadata keys of a safetensors file written by `leantrain export --format safetensors`.
constexpr const char* kMetaModelConfig = "leantrain.model_config";
constexpr const char* kMetaKind = "leantrain.kind";

bool has_hdf5_signature(const std::string& path) {
  static const char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  char head[8] = {0};
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (fp == nullptr) return false;
  const size_t n = std::fread(head, 1, sizeof head, fp);
  std::fclose(fp);
  return n == sizeof head && std::memcmp(head, kSignature, sizeof head) == 0;
}

std::string read_text(const std::string& path) {
  FILE* fp = std::fopen(path.c_str(), "rb");
  if (fp == nullptr) throw DataError(path + ": cannot open (" + std::string(std::strerror(errno)) + ")");
  std::string s;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, fp)) > 0) {
    s.append(buf, n);
    if (s.size() > checkpoint_io::kSafetensorsMaxHeader) {
      std::fclose(fp);
      throw DataError(path + ": over " + std::to_string(checkpoint_io::kSafetensorsMaxHeader) + " bytes: not a config or index file");
    }
  }
  std::fclose(fp);
  return s;
}

models::NamedTensors to_pairs(std::vector<NamedTensor> ts) {
  models::NamedTensors out;
  for (auto& nt : ts) out.emplace_back(std::move(nt.name), std::move(nt.tensor));
  return out;
}

std::vector<NamedTensor> from_pairs(models::NamedTensors ts) {
  std::vector<NamedTensor> out;
  for (auto& [n, t] : ts) out.push_back({std::move(n), std::move(t)});
  return out;
}

/// The tensors of a Hugging Face directory: model.safetensors, or the shards its
/// model.safetensors.index.json lists (each name in exactly the shard the index says).
std::vector<NamedTensor> read_hf_tensors(const std::string& dir) {
  const std::string single = files::join(dir, "model.safetensors");
  const std::string index = files::join(dir, "model.safetensors.index.json");
  if (files::exists(single)) return checkpoint_io::read_safetensors(single).tensors;
  if (!files::exists(index)) {
    const bool pickle = files::exists(files::join(dir, "pytorch_model.bin"));
    throw DataError(dir + ": no model.safetensors or model.safetensors.index.json" +
                    std::string(pickle ? " (only pytorch_model.bin, a pickle, which leantrain does not read: save the model "
                                         "with save_pretrained(DIR, safe_serialization=True))"
                                       : ""));
  }
  json j;
  try {
    j = json::parse(read_text(index));
  } catch (const json::exception& e) {
    throw DataError(index + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw DataError(index + ": no \"weight_map\" object");
  std::map<std::string, std::set<std::string>> by_shard;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) throw DataError(index + ": weight_map[\"" + name + "\"] is not a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f[0] == '.')
      throw DataError(index + ": weight_map[\"" + name + "\"] = \"" + f + "\" is not a file name in " + dir);
    by_shard[f].insert(name);
  }
  std::vector<NamedTensor> out;
  for (const auto& [file, names] : by_shard) {
    const std::string shard = files::join(dir, file);
    auto st = checkpoint_io::read_safetensors(shard);
    std::set<std::string> found;
    for (auto& nt : st.tensors) {
      if (!names.count(nt.name))
        throw DataError(shard + ": tensor '" + nt.name + "' is not listed for this shard in " + index);
      found.insert(nt.name);
      out.push_back(std::move(nt));
    }
    for (const auto& n : names)
      if (!found.count(n)) throw DataError(index + ": tensor '" + n + "' is listed in " + file + ", which does not hold it");
  }
  return out;
}

/// Floating-point tensors in the model's dtype (pretrained files are often fp16 or bf16).
void to_model_dtypes(std::vector<NamedTensor>& ts, const std::vector<NamedTensor>& expected) {
  std::map<std::string, torch::ScalarType> want;
  for (const auto& e : expected) want[e.name] = e.tensor.scalar_type();
  for (auto& nt : ts) {
    auto it = want.find(nt.name);
    if (it == want.end() || nt.tensor.scalar_type() == it->second) continue;
    if (nt.tensor.is_floating_point() && c10::isFloatingType(it->second)) nt.tensor = nt.tensor.to(it->second);
  }
}

InitWeights import_foreign(const models::ModelKind& kind, const ModelSection& section, models::ForeignWeights w,
                           const std::string& what) {
  if (!kind.import_weights)
    throw ConfigError(w.source + ": " + what + ", but model.kind = " + kind.name +
                      " reads no other library's weights (only leantrain checkpoints and leantrain-named safetensors)");
  auto im = kind.import_weights(section.options, w);
  InitWeights out;
  out.tensors = from_pairs(std::move(im.tensors));
  out.description = im.format;
  out.notes = std::move(im.notes);
  return out;
}

}  // namespace

InitWeights read_init_weights(const std::string& path, const ModelSection& section,
                              const std::vector<NamedTensor>& expected) {
  const auto& kind = models::model_kind(section.kind);
  InitWeights out;
  if (!files::exists(path)) throw DataError(path + ": no such file or directory (--init-from)");
  if (files::is_directory(path)) {
    const std::string config = files::join(path, "config.json");
    if (!files::exists(config))
      throw DataError(path + ": a directory without config.json; --init-from takes a checkpoint file, a .safetensors "
                             "file or a Hugging Face model directory (config.json + model.safetensors)");
    models::ForeignWeights w;
    w.config_json = read_text(config);
    if (w.config_json.empty()) throw DataError(config + ": empty");
    w.source = path;
    if (!kind.import_weights)
      throw ConfigError(path + ": a Hugging Face model directory, but model.kind = " + kind.name +
                        " reads no Hugging Face weights");
    w.tensors = to_pairs(read_hf_tensors(path));
    out = import_foreign(kind, section, std::move(w), "a Hugging Face model directory");
    out.description = "Hugging Face " + out.description;
  } else if (has_hdf5_signature(path) || (path.size() > 3 && path.compare(path.size() - 3, 3, ".h5") == 0)) {
    auto c = checkpoint_io::read_checkpoint(path);
    out.tensors = std::move(c.model);
    out.description = "leantrain checkpoint, step " + std::to_string(c.step);
  } else {
    auto st = checkpoint_io::read_safetensors(path);
    std::set<std::string> names;
    for (const auto& e : expected) names.insert(e.name);
    size_t ours = 0;
    for (const auto& nt : st.tensors) ours += names.count(nt.name);
    auto meta_kind = st.metadata.find(kMetaKind);
    if (meta_kind != st.metadata.end() && meta_kind->second != section.kind)
      throw DataError(path + ": written for model.kind = " + meta_kind->second + ", not " + section.kind);
    const bool leantrain_names = st.metadata.count(kMetaModelConfig) > 0 || 2 * ours >= st.tensors.size() ||
                                 !kind.import_weights;
    if (leantrain_names) {
      out.tensors = std::move(st.tensors);
      out.description = "safetensors in leantrain's names";
    } else {
      models::ForeignWeights w;
      w.tensors = to_pairs(std::move(st.tensors));
      w.source = path;
      out = import_foreign(kind, section, std::move(w), "a safetensors file in another library's names");
    }
  }
  to_model_dtypes(out.tensors, expected);
  return out;
}

InitResult init_model(const std::string& path, const ModelSection& section, torch::nn::Module& model,
                      bool skip_mismatched) {
  auto expected = model_tensors(model);
  auto w = read_init_weights(path, section, expected);
  checkpoint_io::Checkpoint c;
  c.model = std::move(w.tensors);
  InitResult r;
  r.skipped = checkpoint_io::check_model(c, expected, path, skip_mismatched);
  std::map<std::string, const torch::Tensor*> saved;
  for (const auto& nt : c.model) saved[nt.name] = &nt.tensor;
  torch::NoGradGuard no_grad;
  for (auto& nt : expected) {
    const auto& s = *saved.at(nt.name);
    if (s.sizes() != nt.tensor.sizes()) continue;
    nt.tensor.copy_(s);
    ++r.loaded;
  }
  r.description = std::move(w.description);
  r.notes = std::move(w.notes);
  return r;
}

ModelSection checkpoint_model_section(const checkpoint_io::Checkpoint& c, const std::string& path) {
  json j;
  try {
    j = json::parse(c.model_config);
  } catch (const json::exception& e) {
    throw checkpoint_io::CheckpointError(path + ": attribute model_config is not JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw checkpoint_io::CheckpointError(path + ": attribute model_config is not a JSON object");
  std::vector<std::string> sets;
  for (const auto& [key, value] : j.items()) sets.push_back("model." + key + "=" + value.dump());
  return models::resolve_model(parse_config("", path + " (model_config)", sets).model);
}

std::vector<std::string> export_weights(const std::string& checkpoint, const std::string& format,
                                        const std::string& out_dir, std::vector<std::string>* notes) {
  if (format != "safetensors" && format != "hf")
    throw ConfigError("--format " + format + ": must be safetensors (leantrain's names) or hf (Hugging Face / "
                      "torchvision names)");
  // Everything is read, checked and converted before anything is written.
  auto c = checkpoint_io::read_checkpoint(checkpoint);
  const auto section = checkpoint_model_section(c, checkpoint);
  const auto& kind = models::model_kind(section.kind);
  auto model = models::build_model(section);
  const auto expected = model_tensors(*model);
  checkpoint_io::check_model(c, expected, checkpoint);
  std::map<std::string, torch::Tensor> saved;
  for (auto& nt : c.model) saved[nt.name] = nt.tensor;
  models::NamedTensors ordered;  // the model's order
  for (const auto& e : expected) ordered.emplace_back(e.name, saved.at(e.name));
  model.reset();

  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string config_json;
  if (format == "safetensors") {
    tensors = from_pairs(std::move(ordered));
    metadata = {{"format", "pt"}, {kMetaKind, section.kind}, {kMetaModelConfig, c.model_config}};
  } else {
    if (!kind.export_weights)
      throw ConfigError("--format hf: model.kind = " + section.kind + " (" + checkpoint +
                        ") has no Hugging Face or torchvision counterpart; use --format safetensors");
    auto e = kind.export_weights(section.options, ordered);
    tensors = from_pairs(std::move(e.tensors));
    metadata = std::move(e.metadata);
    config_json = std::move(e.config_json);
    if (notes) *notes = e.notes;
  }

  if (files::exists(out_dir) && !files::is_directory(out_dir))
    throw StorageError(out_dir + ": exists and is not a directory; nothing written");
  try {
    files::make_dirs(out_dir);
  } catch (const std::exception& e) {
    throw StorageError(out_dir + ": " + e.what() + "; nothing written");
  }
  std::vector<std::string> written;
  const std::string weights = files::join(out_dir, "model.safetensors");
  checkpoint_io::write_safetensors(weights, tensors, metadata);
  written.push_back(weights);
  if (!config_json.empty()) {
    const std::string config = files::join(out_dir, "config.json");
    try {
      files::write_atomic(config, config_json);
    } catch (const std::exception& e) {
      ::unlink(weights.c_str());
      throw StorageError(config + ": " + e.what() + "; nothing written");
    }
    written.push_back(config);
  }
  return written;
}

}  // namespace lt::trainers
