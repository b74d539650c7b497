// Pretrained weights in (--init-from) and out (leantrain export), kind-agnostic: another
// library's names are converted by the model kind's hooks (models/foreign_weights.h).
#include "leantrain/trainers/pretrained.h"

#include <torch/torch.h>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
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
  for (const auto& [file, names] : by_shard)
    if (!files::exists(files::join(dir, file)))
      throw DataError(index + ": weight_map puts " + std::to_string(names.size()) + " tensor" +
                      (names.size() == 1 ? "" : "s") + " (e.g. '" + *names.begin() + "') in " + file + ", but " +
                      files::join(dir, file) + " does not exist (an incomplete download?)");
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

/// "model_type \"llama\", architectures [\"LlamaForCausalLM\"]" of a config.json's text.
std::string architecture_of(const std::string& config_json) {
  try {
    const json j = json::parse(config_json);
    if (!j.is_object()) return "not a JSON object";
    const std::string mt = j.contains("model_type") && j["model_type"].is_string() ? "\"" + j["model_type"].get<std::string>() + "\"" : "none";
    return "model_type " + mt + ", architectures " + (j.contains("architectures") ? j["architectures"].dump() : "none");
  } catch (const json::exception& e) {
    return std::string("not valid JSON (") + e.what() + ")";
  }
}

/// The kind (other than `except`) whose options come from this config.json; "" when none.
std::string kind_reading(const std::string& config_json, const std::string& dir, const std::string& except) {
  for (const auto& name : models::model_kind_names()) {
    const auto& k = models::model_kind(name);
    if (name != except && k.options_from_foreign && k.options_from_foreign(Options{}, config_json, dir)) return name;
  }
  return "";
}

/// The kinds that read Hugging Face directories, for a message.
std::string importing_kinds() {
  std::string s;
  for (const auto& name : models::model_kind_names())
    if (models::model_kind(name).import_weights) s += (s.empty() ? "" : ", ") + name;
  return s;
}

/// "filled from DIR/config.json: hidden_size = 64, ..." for the keys `filled` has and `given` lacks.
std::string filled_note(const Options& given, const Options& filled, const std::string& dir) {
  std::string s;
  for (const auto& [k, v] : filled.values())
    if (!given.has(k)) s += (s.empty() ? "" : ", ") + k + " = " + option_literal(v);
  return s.empty() ? "" : "model options from " + files::join(dir, "config.json") + ": " + s;
}

}  // namespace

ModelSection model_section_for_init(const ModelSection& given, const std::string& init_from,
                                   std::vector<std::string>* notes) {
  if (init_from.empty() || !files::is_directory(init_from) || !files::exists(files::join(init_from, "config.json")))
    return given;
  const std::string text = read_text(files::join(init_from, "config.json"));
  ModelSection out = given;
  std::optional<Options> filled;
  if (!given.kind.empty()) {
    const auto& kind = models::model_kind(given.kind);
    if (kind.options_from_foreign) filled = kind.options_from_foreign(given.options, text, init_from);
    const std::string other = filled ? "" : kind_reading(text, init_from, given.kind);
    if (!other.empty())
      throw ConfigError("model.kind = " + given.kind + ", but " + init_from + " is a Hugging Face model (" +
                        architecture_of(text) + ") that model.kind = \"" + other + "\" reads: set model.kind = \"" +
                        other + "\" (--set model.kind=" + other + "); its options come from config.json");
  } else {
    for (const auto& name : models::model_kind_names()) {
      const auto& kind = models::model_kind(name);
      if (kind.options_from_foreign && (filled = kind.options_from_foreign(given.options, text, init_from))) {
        out.kind = name;
        if (notes) notes->push_back("model.kind = \"" + name + "\" from " + files::join(init_from, "config.json"));
        break;
      }
    }
    if (!filled)
      throw ConfigError(init_from + " is a Hugging Face model (" + architecture_of(text) +
                        ") and model.kind is not set: no kind's options come from its config.json; set model.kind "
                        "to a kind that reads it (the kinds that read other libraries' weights: " + importing_kinds() + ")");
  }
  if (filled) {
    const std::string note = filled_note(given.options, *filled, init_from);
    if (notes && !note.empty()) notes->push_back(note);
    out.options = std::move(*filled);
  }
  // config.json against the options before a model is built: the kind's import, given no tensors.
  const ModelSection resolved = models::resolve_model(out);
  const auto& kind = models::model_kind(resolved.kind);
  if (!kind.import_weights)
    throw ConfigError(init_from + ": a Hugging Face model directory, but model.kind = " + kind.name +
                      " reads no Hugging Face weights");
  models::ForeignWeights w;
  w.config_json = text;
  w.source = init_from;
  (void)kind.import_weights(resolved.options, w);
  return out;
}

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

namespace {

// What an export writes, converted before anything is written.
struct ExportContent {
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata;
  std::string config_json;  // hf with a config (Hugging Face); empty otherwise
  std::string kind;
};

ExportContent convert_checkpoint(const std::string& checkpoint, const std::string& format,
                                 std::vector<std::string>* notes) {
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

  ExportContent out;
  out.kind = section.kind;
  if (format == "safetensors") {
    out.tensors = from_pairs(std::move(ordered));
    out.metadata = {{"format", "pt"}, {kMetaKind, section.kind}, {kMetaModelConfig, c.model_config}};
    return out;
  }
  if (!kind.export_weights)
    throw ConfigError("--format hf: model.kind = " + section.kind + " (" + checkpoint +
                      ") has no Hugging Face or torchvision counterpart; use --format safetensors");
  auto e = kind.export_weights(section.options, ordered);
  out.tensors = from_pairs(std::move(e.tensors));
  out.metadata = std::move(e.metadata);
  out.config_json = std::move(e.config_json);
  if (notes) *notes = e.notes;
  return out;
}

/// fp32 | bf16 | fp16 -> the torch dtype and transformers' name for it.
std::pair<torch::ScalarType, std::string> export_dtype(const std::string& name) {
  if (name == "fp32") return {torch::kFloat, "float32"};
  if (name == "bf16") return {torch::kBFloat16, "bfloat16"};
  if (name == "fp16") return {torch::kHalf, "float16"};
  throw ConfigError("--dtype " + name + ": must be fp32, bf16 or fp16");
}

/// The floating-point tensors in `dtype`, and config.json's dtype (torch_dtype) saying so.
void cast_floating(ExportContent& e, torch::ScalarType dtype, const std::string& hf_name) {
  for (auto& nt : e.tensors)
    if (nt.tensor.is_floating_point() && nt.tensor.scalar_type() != dtype) nt.tensor = nt.tensor.to(dtype).contiguous();
  if (e.config_json.empty()) return;
  json c = json::parse(e.config_json);
  for (const char* k : {"dtype", "torch_dtype"})
    if (c.contains(k)) c[k] = hf_name;
  e.config_json = c.dump(2) + "\n";
}

/// The source's config.json under the export's: keys the export leaves out or null come from
/// the source (token ids, generation settings), except the ones that describe the source's
/// own files (dtype, quantisation).
std::string merge_source_config(const std::string& config_json, const std::string& source, std::vector<std::string>* notes) {
  const std::string path = files::join(source, "config.json");
  if (!files::exists(path)) throw DataError(source + ": no config.json (--source names the Hugging Face directory the model came from)");
  json src, mine = json::parse(config_json);
  try {
    src = json::parse(read_text(path));
  } catch (const json::exception& e) {
    throw DataError(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!src.is_object() || src.value("model_type", json()) != mine.value("model_type", json())) {
    if (notes) notes->push_back(path + " is not a " + mine.value("model_type", std::string("?")) +
                                " config.json; none of its keys kept");
    return config_json;
  }
  static const std::set<std::string> own = {"torch_dtype", "dtype", "quantization_config", "_name_or_path"};
  std::vector<std::string> kept;
  for (const auto& [k, v] : src.items()) {
    if (own.count(k) || v.is_null() || (mine.contains(k) && !mine[k].is_null())) continue;
    mine[k] = v;
    kept.push_back(k);
  }
  if (notes && !kept.empty()) {
    std::string list;
    for (const auto& k : kept) list += (list.empty() ? "" : ", ") + k;
    notes->push_back("kept from " + path + ": " + list);
  }
  return mine.dump(2) + "\n";
}

int64_t tensor_bytes(const torch::Tensor& t) { return t.numel() * static_cast<int64_t>(t.element_size()); }

}  // namespace

std::vector<std::vector<size_t>> shard_plan(const std::vector<NamedTensor>& tensors, int64_t max_shard_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t current = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t b = tensor_bytes(tensors[i].tensor);
    if (shards.empty() || (max_shard_bytes > 0 && current + b > max_shard_bytes && !shards.back().empty())) {
      shards.emplace_back();
      current = 0;
    }
    shards.back().push_back(i);
    current += b;
  }
  if (shards.empty()) shards.emplace_back();
  return shards;
}

namespace {

/// Writes the weights (one file, or shards + index) and the config; on a failure removes what
/// it wrote and throws StorageError. Returns the files written.
std::vector<std::string> write_export(const std::string& out_dir, const ExportContent& e, int64_t max_shard_bytes) {
  std::vector<std::string> written;
  auto undo = [&written](const std::string& what) {
    for (const auto& w : written) ::unlink(w.c_str());
    throw StorageError(what + "; nothing written");
  };
  const auto plan = shard_plan(e.tensors, e.config_json.empty() ? 0 : max_shard_bytes);
  json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
  int64_t total = 0, params = 0;
  for (size_t s = 0; s < plan.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", s + 1, plan.size());
    const std::string file = plan.size() == 1 ? "model.safetensors" : name;
    std::vector<NamedTensor> part;
    for (size_t i : plan[s]) {
      part.push_back(e.tensors[i]);
      index["weight_map"][e.tensors[i].name] = file;
      total += tensor_bytes(e.tensors[i].tensor);
      params += e.tensors[i].tensor.numel();
    }
    const std::string path = files::join(out_dir, file);
    try {
      checkpoint_io::write_safetensors(path, part, e.metadata);
    } catch (const StorageError& err) {
      undo(err.what());
    }
    written.push_back(path);
  }
  std::vector<std::pair<std::string, std::string>> texts;
  if (plan.size() > 1) {
    index["metadata"] = {{"total_size", total}, {"total_parameters", params}};
    texts.emplace_back("model.safetensors.index.json", index.dump(2) + "\n");
  }
  if (!e.config_json.empty()) texts.emplace_back("config.json", e.config_json);
  for (const auto& [file, text] : texts) {
    const std::string path = files::join(out_dir, file);
    try {
      files::write_atomic(path, text);
    } catch (const std::exception& err) {
      undo(path + ": " + err.what());
    }
    written.push_back(path);
  }
  return written;
}

/// The tokenizer and generation files of the source directory, copied beside the weights.
std::vector<std::string> copy_source_files(const std::string& source, const std::string& out_dir) {
  static const char* kFiles[] = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                 "generation_config.json", "tokenizer.model",  "vocab.json",
                                 "merges.txt",        "added_tokens.json",     "chat_template.jinja"};
  std::vector<std::string> copied;
  for (const char* f : kFiles) {
    const std::string from = files::join(source, f);
    if (!files::exists(from)) continue;
    const std::string to = files::join(out_dir, f);
    try {
      files::write_atomic(to, read_text(from));
    } catch (const DataError&) {
      throw;
    } catch (const std::exception& err) {
      throw StorageError(to + ": " + err.what() + " (the weights and config.json are written)");
    }
    copied.push_back(to);
  }
  return copied;
}

/// Weight files of an earlier export that this one did not write (from_pretrained would read
/// a stale model.safetensors before the new shards' index).
void remove_stale_weights(const std::string& out_dir, const std::vector<std::string>& written) {
  const std::set<std::string> now(written.begin(), written.end());
  for (const auto& name : files::list_dir(out_dir)) {
    const bool weights = name == "model.safetensors" || name == "model.safetensors.index.json" ||
                         (name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                          name.size() > 12 && name.compare(name.size() - 12, 12, ".safetensors") == 0);
    const std::string path = files::join(out_dir, name);
    if (weights && !now.count(path)) ::unlink(path.c_str());
  }
}

}  // namespace

std::vector<std::string> export_weights(const std::string& checkpoint, const std::string& format,
                                        const std::string& out_dir, std::vector<std::string>* notes,
                                        const ExportOptions& opt) {
  if (format != "safetensors" && format != "hf")
    throw ConfigError("--format " + format + ": must be safetensors (leantrain's names) or hf (Hugging Face / "
                      "torchvision names)");
  const auto [dtype, dtype_name] = export_dtype(opt.dtype);
  if (opt.max_shard_bytes < 0) throw ConfigError("--max-shard-size: must be >= 0 (0: one file)");
  if (!opt.source.empty() && format != "hf") throw ConfigError("--source is for --format hf");
  if (!opt.source.empty() && !files::is_directory(opt.source))
    throw DataError(opt.source + ": not a directory (--source names the Hugging Face directory the model came from)");
  // Everything is read, checked and converted before anything is written.
  auto e = convert_checkpoint(checkpoint, format, notes);
  cast_floating(e, dtype, dtype_name);
  if (!opt.source.empty()) {
    if (e.config_json.empty())
      throw ConfigError("--source: model.kind = " + e.kind + " exports no Hugging Face config.json to complete");
    e.config_json = merge_source_config(e.config_json, opt.source, notes);
  }

  if (files::exists(out_dir) && !files::is_directory(out_dir))
    throw StorageError(out_dir + ": exists and is not a directory; nothing written");
  try {
    files::make_dirs(out_dir);
  } catch (const std::exception& err) {
    throw StorageError(out_dir + ": " + err.what() + "; nothing written");
  }
  auto written = write_export(out_dir, e, opt.max_shard_bytes);
  remove_stale_weights(out_dir, written);
  if (!opt.source.empty())
    for (auto& f : copy_source_files(opt.source, out_dir)) written.push_back(std::move(f));
  return written;
}

}  // namespace lt::trainers
