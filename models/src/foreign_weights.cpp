// Other libraries' weights <-> the built-in kinds' names and layouts: Hugging Face
// GPT2LMHeadModel (gpt), BertForMaskedLM (bert), torchvision ResNet (resnet). Each section
// starts with its table of names.
//
// Note [Foreign weights]
// An import renames and re-lays out tensors and checks the source's config.json against the
// model's options (naming each disagreement); it does not check shapes: the caller checks
// every converted tensor's name and shape against the model and lists the mismatches, so
// --init-skip-mismatched can skip a new head. A foreign name that fits no pattern is listed
// as unexpected; the tensors the model has no use for (causal-mask buffers, BERT's pooler
// and next-sentence head, position ids) are ignored with a note; tied heads are checked to
// equal the embedding they are tied to. Positions beyond model.seq_len are cropped (the
// first seq_len rows, as nanoGPT's crop_block_size) with a note. Exports are the inverse
// and write the config.json Hugging Face reads back.
#include "foreign_weights.h"

#include <torch/torch.h>

#include <cctype>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "leantrain/models/resnet.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {
namespace {

using json = nlohmann::json;

std::string dims(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

/// "h.12.attn.c_attn.weight" with prefix "h." -> index 12, rest "attn.c_attn.weight".
bool split_index(const std::string& name, const std::string& prefix, int64_t* index, std::string* rest) {
  if (!starts_with(name, prefix)) return false;
  size_t i = prefix.size(), j = i;
  while (j < name.size() && std::isdigit(static_cast<unsigned char>(name[j]))) ++j;
  if (j == i || j - i > 9 || j >= name.size() || name[j] != '.') return false;
  *index = std::stoll(name.substr(i, j - i));
  *rest = name.substr(j + 1);
  return true;
}

std::string problems_text(const std::vector<std::string>& p) {
  std::string s;
  for (const auto& x : p) s += "\n  " + x;
  return s;
}

std::string short_list(const std::vector<std::string>& names, size_t n = 4) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < n; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > n) s += ", ... (" + std::to_string(names.size()) + " in all)";
  return s;
}

// ---- config.json ----

/// A Hugging Face config.json, checked against the model's options.
class HfConfig {
 public:
  HfConfig(const std::string& text, const std::string& source) : where_(source + "/config.json") {
    try {
      j_ = json::parse(text);
    } catch (const json::exception& e) {
      throw DataError(where_ + ": not valid JSON (" + e.what() + ")");
    }
    if (!j_.is_object()) throw DataError(where_ + ": not a JSON object");
  }

  /// The architecture: model_type and architectures must name one of `archs`.
  void require(const std::string& model_type, const std::vector<std::string>& archs, const std::string& kind) const {
    std::string want;
    for (const auto& a : archs) want += (want.empty() ? "" : " or ") + a;
    const std::string mt = j_.contains("model_type") && j_["model_type"].is_string() ? j_["model_type"].get<std::string>() : "";
    bool arch_ok = !j_.contains("architectures");
    std::string arch_text = "none";
    if (j_.contains("architectures")) {
      arch_text = j_["architectures"].dump();
      if (j_["architectures"].is_array())
        for (const auto& a : j_["architectures"])
          for (const auto& w : archs)
            if (a.is_string() && a.get<std::string>() == w) arch_ok = true;
    }
    if (mt.empty() && !j_.contains("architectures"))
      throw DataError(where_ + ": names no architecture (no model_type, no architectures); model.kind = " + kind +
                      " reads " + want + " (model_type \"" + model_type + "\")");
    if ((!mt.empty() && mt != model_type) || !arch_ok)
      throw DataError(where_ + ": a Hugging Face model of another architecture (model_type \"" + mt +
                      "\", architectures " + arch_text + "); model.kind = " + kind + " reads " + want +
                      " (model_type \"" + model_type + "\")");
  }

  bool has(const std::string& key) const { return j_.contains(key) && !j_[key].is_null(); }

  /// A disagreement when `key` is present and differs from the model's `option` value.
  void expect(const std::string& key, int64_t want, const std::string& option) {
    if (!has(key)) return;
    const auto& v = j_[key];
    if (!v.is_number_integer()) {
      problems_.push_back(key + " = " + v.dump() + " is not an integer (model." + option + " = " + std::to_string(want) + ")");
      return;
    }
    if (v.get<int64_t>() != want)
      problems_.push_back(key + " = " + v.dump() + ", but model." + option + " = " + std::to_string(want));
  }
  void expect_at_least(const std::string& key, int64_t want, const std::string& option) {
    if (!has(key)) return;
    const auto& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < want)
      problems_.push_back(key + " = " + v.dump() + " is shorter than model." + option + " = " + std::to_string(want) +
                          " (positions can be cropped, not added)");
  }
  void expect_number(const std::string& key, double want, const std::string& what) {
    if (!has(key)) return;
    const auto& v = j_[key];
    if (!v.is_number() || std::abs(v.get<double>() - want) > 1e-9 * std::abs(want))
      problems_.push_back(key + " = " + v.dump() + ", but " + what);
  }
  void expect_string(const std::string& key, const std::vector<std::string>& allowed, const std::string& what) {
    if (!has(key)) return;
    const auto& v = j_[key];
    for (const auto& a : allowed)
      if (v.is_string() && v.get<std::string>() == a) return;
    problems_.push_back(key + " = " + v.dump() + ", but " + what);
  }
  void expect_bool(const std::string& key, bool want, const std::string& what) {
    if (!has(key)) return;
    const auto& v = j_[key];
    if (!v.is_boolean() || v.get<bool>() != want) problems_.push_back(key + " = " + v.dump() + ", but " + what);
  }
  /// Throws when any expectation failed, listing all of them.
  void finish() const {
    if (problems_.empty()) return;
    throw DataError(where_ + " disagrees with the model (" + std::to_string(problems_.size()) + "):" +
                    problems_text(problems_));
  }

 private:
  std::string where_;
  json j_;
  std::vector<std::string> problems_;
};

// ---- the conversion state shared by the imports ----

struct Import {
  const ForeignWeights& w;
  std::string what;                        // "GPT2LMHeadModel"
  ImportedWeights out;
  std::vector<std::string> problems;       // unexpected or inconsistent tensors
  std::vector<std::string> ignored;

  void put(const std::string& name, torch::Tensor t) { out.tensors.emplace_back(name, std::move(t)); }
  void unexpected(const std::string& foreign, const torch::Tensor& t) {
    problems.push_back("unexpected " + foreign + " " + dims(t) + ": not a " + what + " weight leantrain reads");
  }
  /// Conv1D [in, out] -> Linear [out, in].
  void put_transposed(const std::string& name, const std::string& foreign, const torch::Tensor& t) {
    if (t.dim() != 2) {
      problems.push_back(foreign + ": shape " + dims(t) + ", expected a matrix");
      return;
    }
    put(name, t.t().contiguous());
  }
  /// The first `rows` rows of a position table (crop_block_size) when it has more.
  void put_positions(const std::string& name, const std::string& foreign, const torch::Tensor& t, int64_t rows) {
    if (t.dim() == 2 && t.size(0) > rows) {
      out.notes.push_back("took the first " + std::to_string(rows) + " of " + std::to_string(t.size(0)) + " position rows of " +
                          foreign + " (model.seq_len = " + std::to_string(rows) + ")");
      put(name, t.narrow(0, 0, rows).contiguous());
      return;
    }
    put(name, t);
  }
  /// A tied copy (lm_head.weight): must equal the tensor it is tied to, then dropped.
  void check_tied(const std::string& foreign, const torch::Tensor& t, const std::string& to_foreign,
                  const std::map<std::string, torch::Tensor>& all) {
    auto it = all.find(to_foreign);
    if (it == all.end()) return;  // missing: reported as a missing tensor of the model
    if (!t.sizes().equals(it->second.sizes()) || !torch::equal(t.to(it->second.dtype()), it->second))
      problems.push_back(foreign + " differs from " + to_foreign + ": leantrain ties them (an untied head cannot be loaded)");
    else
      ignored.push_back(foreign + " (tied to " + to_foreign + ")");
  }
  ImportedWeights finish() {
    if (!problems.empty())
      throw DataError(w.source + ": " + std::to_string(problems.size()) + " tensor" + (problems.size() == 1 ? "" : "s") +
                      " of the " + what + " weights cannot be placed:" + problems_text(problems));
    out.format = what;
    if (!ignored.empty()) out.notes.push_back("ignored " + std::to_string(ignored.size()) + " tensors leantrain has no use for: " + short_list(ignored));
    return std::move(out);
  }
};

/// The foreign tensors by name, with `prefix` stripped where present and `rename` applied.
std::map<std::string, torch::Tensor> by_name(const ForeignWeights& w, const std::vector<std::string>& prefixes,
                                             const std::function<std::string(const std::string&)>& rename,
                                             std::vector<std::string>* order, std::vector<std::string>* problems) {
  std::map<std::string, torch::Tensor> m;
  for (const auto& [n, t] : w.tensors) {
    std::string k = n;
    for (const auto& p : prefixes)
      if (starts_with(k, p)) {
        k = k.substr(p.size());
        break;
      }
    if (rename) k = rename(k);
    if (m.count(k)) {
      problems->push_back(n + ": given twice (as " + k + ")");
      continue;
    }
    m[k] = t;
    order->push_back(k);
  }
  return m;
}

const NamedTensors::value_type* find(const NamedTensors& ts, const std::string& name) {
  for (const auto& nt : ts)
    if (nt.first == name) return &nt;
  return nullptr;
}

/// The tensor `name` of an export's input; ConfigError when absent.
torch::Tensor need(const NamedTensors& ts, const std::string& name, const std::string& what) {
  const auto* nt = find(ts, name);
  if (nt == nullptr) throw DataError("no tensor " + name + " to export as " + what);
  return nt->second;
}

// ---- GPT-2 (transformers GPT2LMHeadModel) ----
//
//   leantrain                   transformers (prefix "transformer.", absent in a GPT2Model)
//   wte.weight                  wte.weight            (lm_head.weight: tied, equal or absent)
//   wpe.weight [S,D]            wpe.weight [n_positions,D]  (first S rows)
//   blocks.i.ln1.*              h.i.ln_1.*
//   blocks.i.attn.qkv.weight    h.i.attn.c_attn.weight  (Conv1D [D,3D]: transposed)
//   blocks.i.attn.qkv.bias      h.i.attn.c_attn.bias
//   blocks.i.attn.proj.weight   h.i.attn.c_proj.weight  (transposed)
//   blocks.i.ln2.*              h.i.ln_2.*
//   blocks.i.mlp.fc.weight      h.i.mlp.c_fc.weight     (transposed)
//   blocks.i.mlp.proj.weight    h.i.mlp.c_proj.weight   (transposed)
//   ln_f.*                      ln_f.*
//   (ignored)                   h.i.attn.bias, h.i.attn.masked_bias (causal-mask buffers)

struct LayerName {
  const char* leantrain;
  const char* foreign;
  bool transpose;
};

const std::vector<LayerName>& gpt2_layer_names() {
  static const std::vector<LayerName> t = {
      {"ln1.weight", "ln_1.weight", false},           {"ln1.bias", "ln_1.bias", false},
      {"attn.qkv.weight", "attn.c_attn.weight", true}, {"attn.qkv.bias", "attn.c_attn.bias", false},
      {"attn.proj.weight", "attn.c_proj.weight", true}, {"attn.proj.bias", "attn.c_proj.bias", false},
      {"ln2.weight", "ln_2.weight", false},           {"ln2.bias", "ln_2.bias", false},
      {"mlp.fc.weight", "mlp.c_fc.weight", true},     {"mlp.fc.bias", "mlp.c_fc.bias", false},
      {"mlp.proj.weight", "mlp.c_proj.weight", true}, {"mlp.proj.bias", "mlp.c_proj.bias", false}};
  return t;
}

}  // namespace

ImportedWeights import_gpt2(const ModelConfig& cfg, const ForeignWeights& w) {
  if (!w.config_json.empty()) {
    HfConfig hc(w.config_json, w.source);
    hc.require("gpt2", {"GPT2LMHeadModel", "GPT2Model"}, "gpt");
    hc.expect("n_layer", cfg.n_layer, "n_layer");
    hc.expect("n_head", cfg.n_head, "n_head");
    hc.expect("n_embd", cfg.d_model, "d_model");
    hc.expect("vocab_size", cfg.vocab_size, "vocab_size");
    hc.expect_at_least("n_positions", cfg.seq_len, "seq_len");
    hc.expect("n_inner", cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model, "d_ff (0 means 4 x d_model)");
    hc.expect_number("layer_norm_epsilon", 1e-5, "leantrain's GPT uses LayerNorm eps 1e-5");
    hc.expect_string("activation_function", {"gelu_new", "gelu_pytorch_tanh", "gelu_fast"},
                     "leantrain's GPT uses the tanh GELU (gelu_new)");
    hc.expect_bool("scale_attn_weights", true, "leantrain's GPT scales attention by 1/sqrt(head dim)");
    hc.expect_bool("scale_attn_by_inverse_layer_idx", false, "leantrain's GPT does not scale by the layer index");
    hc.expect_bool("add_cross_attention", false, "leantrain's GPT has no cross-attention");
    hc.expect_bool("tie_word_embeddings", true, "leantrain's GPT ties its head to wte");
    hc.finish();
  }
  Import im{w, "GPT2LMHeadModel", {}, {}, {}};
  std::vector<std::string> order;
  auto all = by_name(w, {"transformer."}, {}, &order, &im.problems);
  std::map<std::string, std::string> layer;  // foreign rest -> leantrain rest
  for (const auto& ln : gpt2_layer_names()) layer[ln.foreign] = ln.leantrain;
  for (const auto& n : order) {
    const auto& t = all.at(n);
    int64_t i = 0;
    std::string rest;
    if (n == "wte.weight") im.put("wte.weight", t);
    else if (n == "wpe.weight") im.put_positions("wpe.weight", "transformer.wpe.weight", t, cfg.seq_len);
    else if (n == "ln_f.weight" || n == "ln_f.bias") im.put(n, t);
    else if (n == "lm_head.weight") im.check_tied("lm_head.weight", t, "wte.weight", all);
    else if (split_index(n, "h.", &i, &rest)) {
      if (rest == "attn.bias" || rest == "attn.masked_bias") {
        im.ignored.push_back("transformer." + n);
        continue;
      }
      auto it = layer.find(rest);
      if (it == layer.end()) {
        im.unexpected("transformer." + n, t);
        continue;
      }
      const std::string to = "blocks." + std::to_string(i) + "." + it->second;
      bool transpose = false;
      for (const auto& ln : gpt2_layer_names())
        if (rest == ln.foreign) transpose = ln.transpose;
      if (transpose) im.put_transposed(to, "transformer." + n, t);
      else im.put(to, t);
    } else {
      im.unexpected(n, t);
    }
  }
  return im.finish();
}

ExportedWeights export_gpt2(const ModelConfig& cfg, const NamedTensors& ts) {
  ExportedWeights e;
  e.format = "Hugging Face GPT2LMHeadModel";
  e.metadata = {{"format", "pt"}};
  const std::string what = e.format;
  e.tensors.emplace_back("transformer.wte.weight", need(ts, "wte.weight", what));
  e.tensors.emplace_back("transformer.wpe.weight", need(ts, "wpe.weight", what));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", h = "transformer.h." + std::to_string(i) + ".";
    for (const auto& ln : gpt2_layer_names()) {
      auto t = need(ts, b + ln.leantrain, what);
      e.tensors.emplace_back(h + ln.foreign, ln.transpose ? t.t().contiguous() : t);
    }
  }
  e.tensors.emplace_back("transformer.ln_f.weight", need(ts, "ln_f.weight", what));
  e.tensors.emplace_back("transformer.ln_f.bias", need(ts, "ln_f.bias", what));
  // lm_head.weight is tied to transformer.wte.weight (tie_word_embeddings), as save_pretrained writes it.
  const int64_t inner = cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model;
  json c = {{"architectures", {"GPT2LMHeadModel"}},
            {"model_type", "gpt2"},
            {"vocab_size", cfg.vocab_size},
            {"n_positions", cfg.seq_len},
            {"n_ctx", cfg.seq_len},
            {"n_embd", cfg.d_model},
            {"n_layer", cfg.n_layer},
            {"n_head", cfg.n_head},
            {"n_inner", inner},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", 1e-5},
            {"resid_pdrop", cfg.dropout},
            {"embd_pdrop", cfg.dropout},
            {"attn_pdrop", cfg.dropout},
            {"initializer_range", 0.02},
            {"scale_attn_weights", true},
            {"scale_attn_by_inverse_layer_idx", false},
            {"reorder_and_upcast_attn", false},
            {"tie_word_embeddings", true},
            {"use_cache", true},
            {"dtype", "float32"}};
  // GPT-2's <|endoftext|> is its last token; another vocabulary has no known one.
  c["bos_token_id"] = c["eos_token_id"] = cfg.vocab_size == 50257 ? json(50256) : json(nullptr);
  e.config_json = c.dump(2) + "\n";
  return e;
}

// ---- BERT (transformers BertForMaskedLM) ----
//
//   leantrain                  transformers (prefix "bert." on the encoder, absent in a BertModel;
//                              legacy LayerNorm.gamma / .beta read as .weight / .bias)
//   tok_emb.weight             embeddings.word_embeddings.weight (cls.predictions.decoder.weight: tied)
//   pos_emb.weight [S,D]       embeddings.position_embeddings.weight (first S rows)
//   type_emb.weight            embeddings.token_type_embeddings.weight
//   emb_ln.*                   embeddings.LayerNorm.*
//   blocks.i.attn.qkv.weight   encoder.layer.i.attention.self.{query,key,value}.weight, concatenated
//   blocks.i.attn.qkv.bias     ... .{query,key,value}.bias, concatenated
//   blocks.i.attn.proj.*       encoder.layer.i.attention.output.dense.*
//   blocks.i.ln1.*             encoder.layer.i.attention.output.LayerNorm.*
//   blocks.i.mlp.fc.*          encoder.layer.i.intermediate.dense.*
//   blocks.i.mlp.proj.*        encoder.layer.i.output.dense.*
//   blocks.i.ln2.*             encoder.layer.i.output.LayerNorm.*
//   mlm.dense.*                cls.predictions.transform.dense.*
//   mlm.ln.*                   cls.predictions.transform.LayerNorm.*
//   mlm.bias                   cls.predictions.bias (cls.predictions.decoder.bias: tied)
//   (ignored)                  pooler.*, cls.seq_relationship.* (next-sentence head),
//                              embeddings.position_ids / token_type_ids (buffers)

namespace {

const std::vector<LayerName>& bert_layer_names() {
  static const std::vector<LayerName> t = {
      {"attn.proj.weight", "attention.output.dense.weight", false},
      {"attn.proj.bias", "attention.output.dense.bias", false},
      {"ln1.weight", "attention.output.LayerNorm.weight", false},
      {"ln1.bias", "attention.output.LayerNorm.bias", false},
      {"mlp.fc.weight", "intermediate.dense.weight", false},
      {"mlp.fc.bias", "intermediate.dense.bias", false},
      {"mlp.proj.weight", "output.dense.weight", false},
      {"mlp.proj.bias", "output.dense.bias", false},
      {"ln2.weight", "output.LayerNorm.weight", false},
      {"ln2.bias", "output.LayerNorm.bias", false}};
  return t;
}

const std::vector<LayerName>& bert_other_names() {
  static const std::vector<LayerName> t = {
      {"tok_emb.weight", "bert.embeddings.word_embeddings.weight", false},
      {"pos_emb.weight", "bert.embeddings.position_embeddings.weight", false},
      {"type_emb.weight", "bert.embeddings.token_type_embeddings.weight", false},
      {"emb_ln.weight", "bert.embeddings.LayerNorm.weight", false},
      {"emb_ln.bias", "bert.embeddings.LayerNorm.bias", false},
      {"mlm.dense.weight", "cls.predictions.transform.dense.weight", false},
      {"mlm.dense.bias", "cls.predictions.transform.dense.bias", false},
      {"mlm.ln.weight", "cls.predictions.transform.LayerNorm.weight", false},
      {"mlm.ln.bias", "cls.predictions.transform.LayerNorm.bias", false},
      {"mlm.bias", "cls.predictions.bias", false}};
  return t;
}

/// Legacy (TF-converted) LayerNorm names: LayerNorm.gamma / LayerNorm.beta.
std::string bert_modern_name(const std::string& n) {
  auto ends = [&](const std::string& suf) {
    return n.size() >= suf.size() && n.compare(n.size() - suf.size(), suf.size(), suf) == 0;
  };
  if (ends("LayerNorm.gamma")) return n.substr(0, n.size() - 5) + "weight";
  if (ends("LayerNorm.beta")) return n.substr(0, n.size() - 4) + "bias";
  return n;
}

}  // namespace

ImportedWeights import_bert(const ModelConfig& cfg, const ForeignWeights& w) {
  if (!w.config_json.empty()) {
    HfConfig hc(w.config_json, w.source);
    hc.require("bert", {"BertForMaskedLM", "BertForPreTraining"}, "bert");
    hc.expect("num_hidden_layers", cfg.n_layer, "n_layer");
    hc.expect("num_attention_heads", cfg.n_head, "n_head");
    hc.expect("hidden_size", cfg.d_model, "d_model");
    hc.expect("vocab_size", cfg.vocab_size, "vocab_size");
    hc.expect("intermediate_size", cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model, "d_ff (0 means 4 x d_model)");
    hc.expect("type_vocab_size", cfg.type_vocab_size, "type_vocab_size");
    hc.expect_at_least("max_position_embeddings", cfg.seq_len, "seq_len");
    hc.expect_number("layer_norm_eps", 1e-12, "leantrain's BERT uses LayerNorm eps 1e-12");
    hc.expect_string("hidden_act", {"gelu"}, "leantrain's BERT uses the exact (erf) GELU");
    hc.expect_string("position_embedding_type", {"absolute"}, "leantrain's BERT has absolute positions");
    hc.expect_bool("is_decoder", false, "leantrain's BERT is an encoder");
    hc.expect_bool("add_cross_attention", false, "leantrain's BERT has no cross-attention");
    hc.expect_bool("tie_word_embeddings", true, "leantrain's BERT ties its decoder to the word embeddings");
    hc.finish();
  }
  Import im{w, "BertForMaskedLM", {}, {}, {}};
  std::vector<std::string> order;
  // Names are kept with "bert." so that the head's "cls." and the encoder's read alike.
  auto all = by_name(w, {}, [](const std::string& n) {
    const std::string m = bert_modern_name(n);
    return starts_with(m, "cls.") || starts_with(m, "bert.") ? m : "bert." + m;
  }, &order, &im.problems);
  std::map<std::string, std::string> other, layer;
  for (const auto& ln : bert_other_names()) other[ln.foreign] = ln.leantrain;
  for (const auto& ln : bert_layer_names()) layer[ln.foreign] = ln.leantrain;
  std::map<int64_t, std::map<std::string, torch::Tensor>> qkv;  // layer -> "query.weight" ... -> tensor
  for (const auto& n : order) {
    const auto& t = all.at(n);
    int64_t i = 0;
    std::string rest;
    auto it = other.find(n);
    if (it != other.end()) {
      if (it->second == "pos_emb.weight") im.put_positions(it->second, n, t, cfg.seq_len);
      else im.put(it->second, t);
    } else if (n == "cls.predictions.decoder.weight") {
      im.check_tied(n, t, "bert.embeddings.word_embeddings.weight", all);
    } else if (n == "cls.predictions.decoder.bias") {
      if (all.count("cls.predictions.bias")) im.check_tied(n, t, "cls.predictions.bias", all);
      else im.put("mlm.bias", t);
    } else if (starts_with(n, "bert.pooler.") || starts_with(n, "cls.seq_relationship.") ||
               n == "bert.embeddings.position_ids" || n == "bert.embeddings.token_type_ids") {
      im.ignored.push_back(n);
    } else if (split_index(n, "bert.encoder.layer.", &i, &rest)) {
      if (starts_with(rest, "attention.self.")) {
        const std::string part = rest.substr(std::string("attention.self.").size());
        static const std::set<std::string> parts = {"query.weight", "key.weight", "value.weight",
                                                    "query.bias", "key.bias", "value.bias"};
        if (parts.count(part)) qkv[i][part] = t;
        else im.unexpected(n, t);
        continue;
      }
      auto lt_it = layer.find(rest);
      if (lt_it == layer.end()) im.unexpected(n, t);
      else im.put("blocks." + std::to_string(i) + "." + lt_it->second, t);
    } else {
      im.unexpected(n, t);
    }
  }
  for (const auto& [i, parts] : qkv) {
    const std::string base = "bert.encoder.layer." + std::to_string(i) + ".attention.self.";
    for (const char* kind : {"weight", "bias"}) {
      std::vector<torch::Tensor> qkv_t;
      std::vector<std::string> missing;
      for (const char* p : {"query", "key", "value"}) {
        auto f = parts.find(std::string(p) + "." + kind);
        if (f == parts.end()) missing.push_back(base + p + "." + kind);
        else qkv_t.push_back(f->second);
      }
      if (!missing.empty()) {
        if (qkv_t.empty()) continue;  // all three missing: the model reports blocks.i.attn.qkv.<kind> missing
        for (const auto& m : missing) im.problems.push_back("missing " + m + " (query, key and value make blocks." +
                                                            std::to_string(i) + ".attn.qkv." + kind + ")");
        continue;
      }
      if (!qkv_t[0].sizes().equals(qkv_t[1].sizes()) || !qkv_t[0].sizes().equals(qkv_t[2].sizes())) {
        im.problems.push_back(base + "{query,key,value}." + kind + ": shapes " + dims(qkv_t[0]) + ", " + dims(qkv_t[1]) +
                              ", " + dims(qkv_t[2]) + " differ");
        continue;
      }
      im.put("blocks." + std::to_string(i) + ".attn.qkv." + kind, torch::cat(qkv_t, 0));
    }
  }
  return im.finish();
}

ExportedWeights export_bert(const ModelConfig& cfg, const NamedTensors& ts) {
  ExportedWeights e;
  e.format = "Hugging Face BertForMaskedLM";
  e.metadata = {{"format", "pt"}};
  const std::string what = e.format;
  for (const auto& ln : bert_other_names()) e.tensors.emplace_back(ln.foreign, need(ts, ln.leantrain, what));
  for (int64_t i = 0; i < cfg.n_layer; ++i) {
    const std::string b = "blocks." + std::to_string(i) + ".", h = "bert.encoder.layer." + std::to_string(i) + ".";
    for (const char* kind : {"weight", "bias"}) {
      auto parts = need(ts, b + "attn.qkv." + kind, what).chunk(3, 0);
      const char* names[] = {"query", "key", "value"};
      for (int p = 0; p < 3; ++p)
        e.tensors.emplace_back(h + "attention.self." + names[p] + "." + kind, parts[p].contiguous());
    }
    for (const auto& ln : bert_layer_names()) e.tensors.emplace_back(h + ln.foreign, need(ts, b + ln.leantrain, what));
  }
  // cls.predictions.decoder.weight / .bias are tied to the word embeddings / cls.predictions.bias.
  json c = {{"architectures", {"BertForMaskedLM"}},
            {"model_type", "bert"},
            {"vocab_size", cfg.vocab_size},
            {"hidden_size", cfg.d_model},
            {"num_hidden_layers", cfg.n_layer},
            {"num_attention_heads", cfg.n_head},
            {"intermediate_size", cfg.d_ff > 0 ? cfg.d_ff : 4 * cfg.d_model},
            {"hidden_act", "gelu"},
            {"hidden_dropout_prob", cfg.dropout},
            {"attention_probs_dropout_prob", cfg.dropout},
            {"max_position_embeddings", cfg.seq_len},
            {"type_vocab_size", cfg.type_vocab_size},
            {"initializer_range", 0.02},
            {"layer_norm_eps", 1e-12},
            {"pad_token_id", 0},
            {"position_embedding_type", "absolute"},
            {"is_decoder", false},
            {"tie_word_embeddings", true},
            {"dtype", "float32"}};
  e.config_json = c.dump(2) + "\n";
  return e;
}

// ---- ResNet (torchvision.models.ResNet state dict) ----
//
//   leantrain                     torchvision
//   stem.conv.weight              conv1.weight
//   stem.bn.*                     bn1.*   (weight, bias, running_mean, running_var, num_batches_tracked)
//   blocks.i.conv1/bn1/...        layerK.j.conv1/bn1/...   (block i = j-th block of stage K, in order)
//   blocks.i.down.conv.weight     layerK.j.downsample.0.weight
//   blocks.i.down.bn.*            layerK.j.downsample.1.*
//   fc.*                          fc.*

namespace {

std::vector<int64_t> resnet_stages(const ModelConfig& cfg) { return resnet_layout(cfg).first; }

}  // namespace

ImportedWeights import_torchvision_resnet(const ModelConfig& cfg, const ForeignWeights& w) {
  if (!w.config_json.empty()) {
    std::string arch;
    try {
      auto j = json::parse(w.config_json);
      if (j.is_object() && j.contains("architectures")) arch = " (architectures " + j["architectures"].dump() + ")";
    } catch (const json::exception&) {
    }
    throw DataError(w.source + "/config.json: a Hugging Face model directory" + arch +
                    "; model.kind = resnet reads torchvision ResNet state dicts (safetensors; convert a .pth with "
                    "tools/torchvision_to_safetensors.py)");
  }
  if (cfg.stem != "imagenet")
    throw DataError(w.source + ": torchvision's ResNet has the imagenet stem (7x7/2 conv + max-pool); model.stem = \"" +
                    cfg.stem + "\" has none of its shapes");
  const auto stages = resnet_stages(cfg);
  Import im{w, "torchvision ResNet", {}, {}, {}};
  std::vector<std::string> order;
  auto all = by_name(w, {"module."}, {}, &order, &im.problems);
  for (const auto& n : order) {
    const auto& t = all.at(n);
    if (starts_with(n, "conv1.")) {
      im.put("stem.conv." + n.substr(6), t);
      continue;
    }
    if (starts_with(n, "bn1.")) {
      im.put("stem.bn." + n.substr(4), t);
      continue;
    }
    if (starts_with(n, "fc.")) {
      im.put(n, t);
      continue;
    }
    int64_t k = 0, j = 0;
    std::string rest, rest2;
    if (starts_with(n, "layer") && split_index(n, "layer", &k, &rest) && split_index(rest, "", &j, &rest2) && k >= 1 &&
        k <= static_cast<int64_t>(stages.size()) && j < stages[static_cast<size_t>(k - 1)]) {
      int64_t i = j;
      for (int64_t s = 0; s + 1 < k; ++s) i += stages[static_cast<size_t>(s)];
      std::string to = rest2;
      if (starts_with(to, "downsample.0.")) to = "down.conv." + to.substr(13);
      else if (starts_with(to, "downsample.1.")) to = "down.bn." + to.substr(13);
      im.put("blocks." + std::to_string(i) + "." + to, t);
      continue;
    }
    im.unexpected(n, t);
  }
  return im.finish();
}

ExportedWeights export_torchvision_resnet(const ModelConfig& cfg, const NamedTensors& ts) {
  if (cfg.stem != "imagenet")
    throw ConfigError("model.stem = \"" + cfg.stem +
                      "\": torchvision's ResNet has the imagenet stem; this model has no torchvision counterpart");
  const auto stages = resnet_stages(cfg);
  ExportedWeights e;
  e.format = "torchvision ResNet state dict";
  e.metadata = {{"format", "pt"}};
  std::vector<std::pair<int64_t, int64_t>> where;  // block i -> (stage K, j)
  for (size_t s = 0; s < stages.size(); ++s)
    for (int64_t j = 0; j < stages[s]; ++j) where.emplace_back(static_cast<int64_t>(s) + 1, j);
  for (const auto& [n, t] : ts) {
    int64_t i = 0;
    std::string rest;
    if (starts_with(n, "stem.conv.")) e.tensors.emplace_back("conv1." + n.substr(10), t);
    else if (starts_with(n, "stem.bn.")) e.tensors.emplace_back("bn1." + n.substr(8), t);
    else if (starts_with(n, "fc.")) e.tensors.emplace_back(n, t);
    else if (split_index(n, "blocks.", &i, &rest) && i < static_cast<int64_t>(where.size())) {
      if (starts_with(rest, "down.conv.")) rest = "downsample.0." + rest.substr(10);
      else if (starts_with(rest, "down.bn.")) rest = "downsample.1." + rest.substr(8);
      const auto [k, j] = where[static_cast<size_t>(i)];
      e.tensors.emplace_back("layer" + std::to_string(k) + "." + std::to_string(j) + "." + rest, t);
    } else {
      throw DataError("no torchvision name for " + n);
    }
  }
  if (cfg.width != 64 || cfg.in_channels != 3 || stages.size() != 4)
    e.notes.push_back("torchvision's resnetN() has 4 stages, width 64 and 3 input channels; this model has " +
                      std::to_string(stages.size()) + " stages, width " + std::to_string(cfg.width) + " and " +
                      std::to_string(cfg.in_channels) + " input channels: load it into a ResNet built to match");
  return e;
}

}  // namespace lt::models
