// The llama kind <-> Hugging Face LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and
// MistralForCausalLM (model.family llama | qwen2 | qwen3 | mistral; SmolLM2 is a Llama).
//
//   leantrain                                  transformers (prefix "model.", absent in a bare *Model)
//   embed_tokens.weight                        embed_tokens.weight
//   blocks.i.input_layernorm.weight            layers.i.input_layernorm.weight
//   blocks.i.self_attn.{q,k,v}_proj.weight     layers.i.self_attn.{q,k,v}_proj.weight
//   blocks.i.self_attn.{q,k,v}_proj.bias       layers.i.self_attn.{q,k,v}_proj.bias   (Qwen2)
//   blocks.i.self_attn.o_proj.weight           layers.i.self_attn.o_proj.weight
//   blocks.i.self_attn.{q,k}_norm.weight       layers.i.self_attn.{q,k}_norm.weight   (Qwen3)
//   blocks.i.post_attention_layernorm.weight   layers.i.post_attention_layernorm.weight
//   blocks.i.mlp.{gate,up,down}_proj.weight    layers.i.mlp.{gate,up,down}_proj.weight
//   norm.weight                                norm.weight
//   lm_head.weight (untied)                    lm_head.weight (no prefix; tied: absent, or ignored)
//   (ignored)                                  layers.i.self_attn.rotary_emb.inv_freq (older saves)
//
// Note [Llama weights as Hugging Face stores them]
// Layouts are the same on both sides: nn.Linear [out, in], RMSNorm weights [features]. The
// q/k projections need no permutation: transformers stores them for RoPE's half-rotation
// convention (rotate_half: the first and second halves of each head's features are the
// pairs), which the llama kind implements too (the permutation Meta's original checkpoints
// need happens in transformers' own conversion script, before any config.json exists).
// A tied checkpoint that also stores lm_head.weight is read as transformers reads it: the
// head is the embedding, the stored copy ignored (with a note when it differs).
//
// Note [config.json of the Llama family]
// The options are config.json's own keys. Both spellings of RoPE are read: transformers 4.x's
// rope_theta + rope_scaling {rope_type | type, factor, ...} and 5.x's rope_parameters
// {rope_type, rope_theta, factor, ...}; rope_scaling wins when both are set, as 5.x reads it.
// Absent keys take the transformers class defaults (num_key_value_heads = heads, head_dim =
// hidden / heads, rms_norm_eps 1e-6, rope_theta 1e4, tie_word_embeddings false,
// original_max_position_embeddings = max_position_embeddings); the sizes must be present.
// What leantrain cannot compute is refused, each key named: another rope_type, a partial
// rotary factor, biases on o_proj (Llama / Qwen3 attention_bias; leantrain's attention_bias
// is Qwen2's q/k/v biases), MLP biases, an activation other than SiLU, heads not divisible
// by key/value heads, and a sliding window shorter than model.seq_len (Mistral; Qwen with
// use_sliding_window): within seq_len a longer window is full causal attention.
#include "foreign_weights_llama.h"

#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {
namespace {

using json = nlohmann::json;

struct Family {
  const char* name;        // model.family
  const char* arch;        // architectures[0]
  const char* model_type;  // model_type
};

const std::vector<Family>& families() {
  static const std::vector<Family> f = {{"llama", "LlamaForCausalLM", "llama"},
                                        {"qwen2", "Qwen2ForCausalLM", "qwen2"},
                                        {"qwen3", "Qwen3ForCausalLM", "qwen3"},
                                        {"mistral", "MistralForCausalLM", "mistral"}};
  return f;
}

std::string supported_text() {
  std::string s;
  for (const auto& f : families()) s += (s.empty() ? "" : ", ") + std::string(f.arch) + " (" + f.model_type + ")";
  return s;
}

const Family* family_named(const std::string& name) {
  for (const auto& f : families())
    if (name == f.name) return &f;
  return nullptr;
}

std::string list_text(const std::vector<std::string>& p) {
  std::string s;
  for (const auto& x : p) s += "\n  " + x;
  return s;
}

bool starts_with(const std::string& s, const std::string& p) { return s.compare(0, p.size(), p) == 0; }

// ---- option values (the kind's resolved options, read by key) ----

const OptionValue& value_of(const Options& o, const std::string& key) {
  const OptionValue* v = o.find(key);
  if (v == nullptr) throw ConfigError("model." + key + ": the llama kind has no such option (its Hugging Face mapping reads it)");
  return *v;
}
int64_t int_of(const Options& o, const std::string& key) {
  const auto& v = value_of(o, key);
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* d = std::get_if<double>(&v)) return static_cast<int64_t>(*d);
  throw ConfigError("model." + key + " = " + option_literal(v) + ": not an integer");
}
double num_of(const Options& o, const std::string& key) {
  const auto& v = value_of(o, key);
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  throw ConfigError("model." + key + " = " + option_literal(v) + ": not a number");
}
bool flag_of(const Options& o, const std::string& key) { return o.flag(key); }
std::string text_of(const Options& o, const std::string& key) { return o.text(key); }

int64_t kv_heads_of(const Options& o) {
  const int64_t kv = int_of(o, "num_key_value_heads");
  return kv > 0 ? kv : int_of(o, "num_attention_heads");
}
int64_t head_dim_of(const Options& o) {
  const int64_t hd = int_of(o, "head_dim");
  return hd > 0 ? hd : int_of(o, "hidden_size") / int_of(o, "num_attention_heads");
}

/// Two option values equal as the model uses them (integers and numbers compared as numbers,
/// within a relative 1e-9: a value printed to JSON and read back).
bool same_value(const OptionValue& a, const OptionValue& b) {
  const bool na = std::holds_alternative<int64_t>(a) || std::holds_alternative<double>(a);
  const bool nb = std::holds_alternative<int64_t>(b) || std::holds_alternative<double>(b);
  if (na && nb) {
    auto d = [](const OptionValue& v) {
      return std::holds_alternative<int64_t>(v) ? static_cast<double>(std::get<int64_t>(v)) : std::get<double>(v);
    };
    const double x = d(a), y = d(b);
    return x == y || std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

// ---- config.json ----

/// A config.json of one of the four architectures, in the kind's option keys.
struct HfLlama {
  std::string where;                      // DIR/config.json
  const Family* family = nullptr;
  Options options;                        // every option config.json determines
  std::map<std::string, std::string> key; // option -> config.json's key for it (messages)
  std::optional<int64_t> sliding_window;  // a window some layer attends within
};

/// Reads config.json's values, collecting what leantrain cannot represent.
class Reader {
 public:
  Reader(const json& j, std::string where) : j_(j), where_(std::move(where)) {}

  bool has(const std::string& k) const { return j_.contains(k) && !j_[k].is_null(); }
  std::optional<int64_t> opt_int(const std::string& k) {
    if (!has(k)) return std::nullopt;
    if (!j_[k].is_number_integer()) {
      problems.push_back(k + " = " + j_[k].dump() + ": not an integer");
      return std::nullopt;
    }
    return j_[k].get<int64_t>();
  }
  int64_t need_int(const std::string& k) {
    if (!has(k)) {
      problems.push_back(k + ": missing (leantrain takes the model's sizes from config.json)");
      return 0;
    }
    return opt_int(k).value_or(0);
  }
  double num(const json& obj, const std::string& k, double dflt, const std::string& shown) {
    if (!obj.contains(k) || obj[k].is_null()) return dflt;
    if (!obj[k].is_number()) {
      problems.push_back(shown + " = " + obj[k].dump() + ": not a number");
      return dflt;
    }
    return obj[k].get<double>();
  }
  double num(const std::string& k, double dflt) { return num(j_, k, dflt, k); }
  bool flag(const std::string& k, bool dflt) {
    if (!has(k)) return dflt;
    if (!j_[k].is_boolean()) {
      problems.push_back(k + " = " + j_[k].dump() + ": not true or false");
      return dflt;
    }
    return j_[k].get<bool>();
  }
  std::string text(const std::string& k, const std::string& dflt) {
    if (!has(k)) return dflt;
    if (!j_[k].is_string()) {
      problems.push_back(k + " = " + j_[k].dump() + ": not a string");
      return dflt;
    }
    return j_[k].get<std::string>();
  }
  const json& raw() const { return j_; }

  std::vector<std::string> problems;

 private:
  const json& j_;
  std::string where_;
};

json parse_config(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw DataError(where + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw DataError(where + ": not a JSON object");
  return j;
}

/// "model_type \"gemma\", architectures [\"GemmaForCausalLM\"]"
std::string architecture_text(const json& j) {
  const std::string mt = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  return "model_type " + (mt.empty() ? std::string("none") : "\"" + mt + "\"") + ", architectures " +
         (j.contains("architectures") ? j["architectures"].dump() : std::string("none"));
}

/// The family config.json names; nullptr when it names none of the four (another kind's).
const Family* family_of(const json& j, const std::string& where) {
  const std::string mt = j.contains("model_type") && j["model_type"].is_string() ? j["model_type"].get<std::string>() : "";
  std::string arch;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string())
    arch = j["architectures"][0].get<std::string>();
  const Family *by_arch = nullptr, *by_type = nullptr;
  for (const auto& f : families()) {
    if (arch == f.arch) by_arch = &f;
    if (mt == f.model_type) by_type = &f;
  }
  if (by_arch == nullptr && by_type == nullptr) return nullptr;
  if (!arch.empty() && by_arch == nullptr)
    throw DataError(where + ": " + architecture_text(j) + ": model.kind = llama reads the causal language models " +
                    supported_text() + ", not " + arch);
  if (by_arch != nullptr && by_type != nullptr && by_arch != by_type)
    throw DataError(where + ": " + architecture_text(j) + ": the architecture and the model_type disagree");
  return by_arch != nullptr ? by_arch : by_type;
}

void read_rope(Reader& r, HfLlama& h, int64_t max_pos) {
  const json& j = r.raw();
  json rp = json::object();
  std::string rp_key = "rope_parameters";
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object() && !j["rope_scaling"].empty()) {
    rp = j["rope_scaling"];
    rp_key = "rope_scaling";
  } else if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    rp = j["rope_parameters"];
  }
  if (!rp.is_object()) {
    r.problems.push_back(rp_key + " = " + rp.dump() + ": not an object");
    return;
  }
  for (const auto& [k, v] : rp.items())
    if (v.is_object()) {
      r.problems.push_back(rp_key + "." + k + ": RoPE parameters per layer type; leantrain has one RoPE for every layer");
      return;
    }
  std::string type = "default", type_key = rp_key + ".rope_type";
  for (const char* k : {"rope_type", "type"})
    if (rp.contains(k) && rp[k].is_string()) {
      type = rp[k].get<std::string>();
      type_key = rp_key + "." + k;
      break;
    }
  const double theta = rp.contains("rope_theta") ? r.num(rp, "rope_theta", 1e4, rp_key + ".rope_theta") : r.num("rope_theta", 1e4);
  h.options.set("rope_theta", theta);
  h.key["rope_theta"] = rp.contains("rope_theta") ? rp_key + ".rope_theta" : "rope_theta";
  const double partial = rp.contains("partial_rotary_factor") ? r.num(rp, "partial_rotary_factor", 1.0, rp_key + ".partial_rotary_factor")
                                                              : r.num("partial_rotary_factor", 1.0);
  if (partial != 1.0)
    r.problems.push_back("partial_rotary_factor = " + json(partial).dump() + ": leantrain rotates every feature of a head (1.0)");
  h.key["rope_scaling"] = type_key;
  if (type == "default") {
    h.options.set("rope_scaling", std::string("none"));
    return;
  }
  if (type != "llama3") {
    r.problems.push_back(type_key + " = \"" + type + "\": leantrain implements RoPE unscaled (\"default\") and " +
                         "\"llama3\" scaling (model.rope_scaling = \"none\" | \"llama3\"), not \"" + type + "\"");
    return;
  }
  h.options.set("rope_scaling", std::string("llama3"));
  const std::pair<const char*, const char*> factors[] = {
      {"rope_factor", "factor"}, {"rope_low_freq_factor", "low_freq_factor"}, {"rope_high_freq_factor", "high_freq_factor"}};
  for (const auto& [opt, k] : factors) {
    if (!rp.contains(k)) r.problems.push_back(rp_key + "." + k + ": missing (llama3 RoPE scaling needs it)");
    h.options.set(opt, r.num(rp, k, 1.0, rp_key + "." + k));
    h.key[opt] = rp_key + "." + k;
  }
  int64_t orig = max_pos;
  if (rp.contains("original_max_position_embeddings")) {
    const auto& v = rp["original_max_position_embeddings"];
    if (v.is_number_integer()) orig = v.get<int64_t>();
    else r.problems.push_back(rp_key + ".original_max_position_embeddings = " + v.dump() + ": not an integer");
  }
  h.options.set("rope_original_max_position_embeddings", orig);
  h.key["rope_original_max_position_embeddings"] = rp_key + ".original_max_position_embeddings";
}

/// Mistral's window, and Qwen's when use_sliding_window or layer_types turn it on.
void read_sliding_window(Reader& r, HfLlama& h) {
  const std::string fam = h.family->name;
  if (fam != "mistral" && fam != "qwen2" && fam != "qwen3") return;
  bool sliding = fam == "mistral";
  if (fam != "mistral") {
    sliding = r.flag("use_sliding_window", false);
    const json& j = r.raw();
    if (j.contains("layer_types") && j["layer_types"].is_array())
      for (const auto& t : j["layer_types"]) {
        const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
        if (s == "sliding_attention") sliding = true;
        else if (s != "full_attention")
          r.problems.push_back("layer_types has \"" + s + "\": leantrain's layers are full_attention (or sliding_attention with a window >= model.seq_len)");
      }
  }
  if (sliding) h.sliding_window = r.opt_int("sliding_window");
}

void read_biases(Reader& r, HfLlama& h) {
  const std::string fam = h.family->name;
  if (r.text("hidden_act", "silu") != "silu" && r.text("hidden_act", "silu") != "swish")
    r.problems.push_back("hidden_act = \"" + r.text("hidden_act", "silu") + "\": leantrain's llama MLP is SwiGLU (silu)");
  if (r.flag("mlp_bias", false)) r.problems.push_back("mlp_bias = true: leantrain's llama MLP has no biases");
  bool bias = fam == "qwen2";  // Qwen2: biases on q, k, v always (no config key)
  if (fam != "qwen2" && r.flag("attention_bias", false))
    r.problems.push_back(std::string("attention_bias = true: ") + h.family->arch +
                         " then has biases on q, k, v and o_proj; leantrain's attention_bias is Qwen2's (q, k, v only)");
  h.options.set("attention_bias", bias);
  h.key["attention_bias"] = fam == "qwen2" ? "architectures (Qwen2's q/k/v biases)" : "attention_bias";
  h.options.set("qk_norm", fam == "qwen3");
  h.key["qk_norm"] = "architectures (Qwen3's q/k norms)";
}

void read_sizes(Reader& r, HfLlama& h) {
  for (const char* k : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                        "max_position_embeddings"}) {
    const int64_t v = r.need_int(k);
    if (r.has(k) && v <= 0) r.problems.push_back(std::string(k) + " = " + std::to_string(v) + ": must be positive");
    h.options.set(k, v);
  }
  const int64_t heads = std::max<int64_t>(1, int_of(h.options, "num_attention_heads"));
  const int64_t kv = r.opt_int("num_key_value_heads").value_or(heads);
  if (kv <= 0 || heads % kv != 0)
    r.problems.push_back("num_attention_heads = " + std::to_string(heads) + " is not a multiple of num_key_value_heads = " +
                         std::to_string(kv) + " (grouped-query attention shares each key/value head among a whole number of query heads)");
  h.options.set("num_key_value_heads", kv);
  const auto hd = r.opt_int("head_dim");
  if (!hd && int_of(h.options, "hidden_size") % heads != 0)
    r.problems.push_back("hidden_size = " + std::to_string(int_of(h.options, "hidden_size")) +
                         " is not a multiple of num_attention_heads = " + std::to_string(heads) + " and head_dim is not given");
  h.options.set("head_dim", hd.value_or(int_of(h.options, "hidden_size") / heads));
  h.options.set("rms_norm_eps", r.num("rms_norm_eps", 1e-6));
  h.options.set("tie_word_embeddings", r.flag("tie_word_embeddings", false));
  h.options.set("hidden_act", std::string("silu"));
}

/// config.json in the kind's options; std::nullopt when it is another architecture's.
std::optional<HfLlama> read_hf(const std::string& text, const std::string& source) {
  HfLlama h;
  h.where = source + "/config.json";
  const json j = parse_config(text, h.where);
  h.family = family_of(j, h.where);
  if (h.family == nullptr) return std::nullopt;
  Reader r(j, h.where);
  read_sizes(r, h);
  read_rope(r, h, int_of(h.options, "max_position_embeddings"));
  read_biases(r, h);
  read_sliding_window(r, h);
  h.options.set("family", std::string(h.family->name));
  h.key["family"] = "architectures";
  if (!r.problems.empty())
    throw DataError(h.where + ": " + std::string(h.family->arch) + " with " + std::to_string(r.problems.size()) +
                    " setting" + (r.problems.size() == 1 ? "" : "s") + " leantrain cannot compute:" + list_text(r.problems));
  return h;
}

/// Each disagreement of config.json with the resolved options: "<key> = <config.json's>, but
/// model.<option> = <the model's>".
std::vector<std::string> disagreements(const HfLlama& h, const Options& o) {
  std::vector<std::string> p;
  for (const auto& [opt, hv] : h.options.values()) {
    OptionValue mine = value_of(o, opt);
    if (opt == "num_key_value_heads") mine = kv_heads_of(o);
    if (opt == "head_dim") mine = head_dim_of(o);
    if (same_value(hv, mine)) continue;
    auto k = h.key.find(opt);
    const std::string shown = k != h.key.end() ? k->second : opt;
    std::string theirs = option_literal(hv);
    if (opt == "family") theirs = "[\"" + std::string(h.family->arch) + "\"] (family \"" + h.family->name + "\")";
    std::string ours = "model." + opt + " = " + option_literal(value_of(o, opt));
    if (opt == "num_key_value_heads" || opt == "head_dim") ours += " (" + option_literal(mine) + ")";
    p.push_back(shown + " = " + theirs + ", but " + ours);
  }
  const int64_t seq = int_of(o, "seq_len");
  if (h.sliding_window && *h.sliding_window < seq)
    p.push_back("sliding_window = " + std::to_string(*h.sliding_window) + " is shorter than model.seq_len = " +
                std::to_string(seq) + ": leantrain attends to the whole context (set model.seq_len <= " +
                std::to_string(*h.sliding_window) + ")");
  return p;
}

[[noreturn]] void refuse(const HfLlama& h, const std::vector<std::string>& p) {
  throw DataError(h.where + " disagrees with the model (" + std::to_string(p.size()) + "):" + list_text(p));
}

// ---- tensors ----

const std::set<std::string>& layer_names() {
  static const std::set<std::string> s = {
      "input_layernorm.weight",    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
      "self_attn.q_proj.bias",     "self_attn.k_proj.bias",   "self_attn.v_proj.bias",   "self_attn.o_proj.weight",
      "self_attn.q_norm.weight",   "self_attn.k_norm.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight",      "mlp.up_proj.weight",      "mlp.down_proj.weight"};
  return s;
}

/// "layers.12.mlp.up_proj.weight" -> 12, "mlp.up_proj.weight".
bool split_layer(const std::string& name, int64_t* index, std::string* rest) {
  if (!starts_with(name, "layers.")) return false;
  size_t i = 7, k = i;
  while (k < name.size() && std::isdigit(static_cast<unsigned char>(name[k]))) ++k;
  if (k == i || k - i > 9 || k >= name.size() || name[k] != '.') return false;
  *index = std::stoll(name.substr(i, k - i));
  *rest = name.substr(k + 1);
  return true;
}

std::string dims(const torch::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

/// The per-layer tensors of the options, in transformers' order within a layer.
std::vector<std::string> layer_tensors(const Options& o) {
  std::vector<std::string> t = {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                "self_attn.v_proj.weight"};
  if (flag_of(o, "attention_bias"))
    for (const char* b : {"self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"}) t.push_back(b);
  t.push_back("self_attn.o_proj.weight");
  if (flag_of(o, "qk_norm"))
    for (const char* n : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}) t.push_back(n);
  for (const char* n : {"post_attention_layernorm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"})
    t.push_back(n);
  return t;
}

/// The family's config.json for the options (every field transformers reads; token ids unknown).
json export_config(const Options& o, const Family& f) {
  const std::string rope = text_of(o, "rope_scaling");
  json rp = {{"rope_type", rope == "llama3" ? "llama3" : "default"}, {"rope_theta", num_of(o, "rope_theta")}};
  json scaling = nullptr;  // transformers 4.x's spelling, read by 5.x too
  if (rope == "llama3") {
    scaling = {{"rope_type", "llama3"},
               {"factor", num_of(o, "rope_factor")},
               {"low_freq_factor", num_of(o, "rope_low_freq_factor")},
               {"high_freq_factor", num_of(o, "rope_high_freq_factor")},
               {"original_max_position_embeddings", int_of(o, "rope_original_max_position_embeddings")}};
    for (const auto& [k, v] : scaling.items()) rp[k] = v;
  }
  const int64_t layers = int_of(o, "num_hidden_layers");
  json c = {{"architectures", {f.arch}},
            {"model_type", f.model_type},
            {"vocab_size", int_of(o, "vocab_size")},
            {"hidden_size", int_of(o, "hidden_size")},
            {"intermediate_size", int_of(o, "intermediate_size")},
            {"num_hidden_layers", layers},
            {"num_attention_heads", int_of(o, "num_attention_heads")},
            {"num_key_value_heads", kv_heads_of(o)},
            {"head_dim", head_dim_of(o)},
            {"hidden_act", text_of(o, "hidden_act")},
            {"max_position_embeddings", int_of(o, "max_position_embeddings")},
            {"rms_norm_eps", num_of(o, "rms_norm_eps")},
            {"rope_theta", num_of(o, "rope_theta")},
            {"rope_scaling", scaling},
            {"rope_parameters", rp},
            {"tie_word_embeddings", flag_of(o, "tie_word_embeddings")},
            {"attention_dropout", 0.0},
            {"initializer_range", 0.02},
            {"use_cache", true},
            {"bos_token_id", nullptr},
            {"eos_token_id", nullptr},
            {"dtype", "float32"}};
  const std::string fam = f.name;
  if (fam == "llama") c.update({{"attention_bias", false}, {"mlp_bias", false}, {"pretraining_tp", 1}});
  if (fam == "qwen3") c["attention_bias"] = false;
  if (fam == "mistral") c["sliding_window"] = nullptr;
  if (fam == "qwen2" || fam == "qwen3") {
    c.update({{"use_sliding_window", false}, {"sliding_window", nullptr}, {"max_window_layers", layers}});
    c["layer_types"] = std::vector<std::string>(static_cast<size_t>(layers), "full_attention");
  }
  return c;
}

/// ConfigError when the options mix switches of two families (transformers has no such model).
void check_exportable(const Options& o, const Family& f) {
  const std::string fam = f.name;
  const bool bias = flag_of(o, "attention_bias"), qk = flag_of(o, "qk_norm");
  std::string why;
  if (bias != (fam == "qwen2"))
    why = bias ? "model.attention_bias = true (q/k/v biases) is Qwen2's: set model.family = \"qwen2\""
               : "Qwen2ForCausalLM has q/k/v biases: set model.attention_bias = true";
  else if (qk != (fam == "qwen3"))
    why = qk ? "model.qk_norm = true is Qwen3's: set model.family = \"qwen3\""
             : "Qwen3ForCausalLM has q/k norms: set model.qk_norm = true";
  else if (text_of(o, "hidden_act") != "silu")
    why = "model.hidden_act = \"" + text_of(o, "hidden_act") + "\": transformers' " + f.arch + " export writes silu";
  if (!why.empty())
    throw ConfigError("model.family = \"" + fam + "\": " + std::string(f.arch) + " has no counterpart for these options: " + why);
}

}  // namespace

std::optional<Options> llama_options_from_foreign(const Options& given, const std::string& config_json,
                                                  const std::string& source) {
  const auto h = read_hf(config_json, source);
  if (!h) return std::nullopt;
  Options merged = given;
  for (const auto& [k, v] : h->options.values())
    if (!given.has(k)) merged.set(k, v);
  // seq_len is the run's, not config.json's: the kind's default unless the model has fewer
  // positions (or a shorter window).
  if (!given.has("seq_len")) {
    int64_t cap = int_of(h->options, "max_position_embeddings");
    if (h->sliding_window) cap = std::min(cap, *h->sliding_window);
    for (const auto& spec : model_kind("llama").options)
      if (spec.key == "seq_len" && std::holds_alternative<int64_t>(spec.default_value) &&
          std::get<int64_t>(spec.default_value) > cap)
        merged.set("seq_len", cap);
  }
  const auto p = disagreements(*h, resolve_model(ModelSection{"llama", merged}).options);
  if (!p.empty()) refuse(*h, p);
  return merged;
}

ImportedWeights import_llama(const Options& o, const ForeignWeights& w) {
  const Family* fam = family_named(text_of(o, "family"));
  if (fam == nullptr) throw ConfigError("model.family = \"" + text_of(o, "family") + "\": not llama | qwen2 | qwen3 | mistral");
  if (!w.config_json.empty()) {
    const auto h = read_hf(w.config_json, w.source);
    if (!h)
      throw DataError(w.source + "/config.json: " + architecture_text(parse_config(w.config_json, w.source)) +
                      ": not an architecture leantrain reads as model.kind = llama; it reads " + supported_text());
    const auto p = disagreements(*h, o);
    if (!p.empty()) refuse(*h, p);
  }
  const bool tied = flag_of(o, "tie_word_embeddings");
  ImportedWeights out;
  out.format = fam->arch;
  std::vector<std::string> problems, ignored;
  std::map<std::string, torch::Tensor> seen;  // names without the prefix
  const torch::Tensor* embed = nullptr;
  const torch::Tensor* head = nullptr;
  std::string head_name;
  for (const auto& [n, t] : w.tensors) {
    const std::string k = starts_with(n, "model.") ? n.substr(6) : n;
    if (!seen.emplace(k, t).second) {
      problems.push_back(n + ": given twice (as " + k + ")");
      continue;
    }
    int64_t i = 0;
    std::string rest;
    if (k == "embed_tokens.weight") {
      embed = &seen.at(k);
      out.tensors.emplace_back(k, t);
    } else if (k == "norm.weight") {
      out.tensors.emplace_back(k, t);
    } else if (k == "lm_head.weight") {
      head = &seen.at(k);
      head_name = n;
      if (!tied) out.tensors.emplace_back(k, t);
    } else if (split_layer(k, &i, &rest) && layer_names().count(rest)) {
      out.tensors.emplace_back("blocks." + std::to_string(i) + "." + rest, t);
    } else if (split_layer(k, &i, &rest) && rest == "self_attn.rotary_emb.inv_freq") {
      ignored.push_back(n);
    } else {
      problems.push_back("unexpected " + n + " " + dims(t) + ": not a " + fam->arch + " weight leantrain reads");
    }
  }
  if (tied && head != nullptr) {
    const bool same = embed != nullptr && head->sizes().equals(embed->sizes()) && torch::equal(head->to(embed->dtype()), *embed);
    ignored.push_back(head_name + (same ? " (tied to model.embed_tokens.weight)" : " (tie_word_embeddings: the head is the embedding)"));
    if (!same)
      out.notes.push_back(head_name + " differs from model.embed_tokens.weight; with tie_word_embeddings = true the "
                          "head is the embedding, as transformers loads it (the stored copy is ignored)");
  }
  if (!problems.empty())
    throw DataError(w.source + ": " + std::to_string(problems.size()) + " tensor" + (problems.size() == 1 ? "" : "s") +
                    " of the " + fam->arch + " weights cannot be placed:" + list_text(problems));
  if (!ignored.empty()) {
    std::string s;
    for (size_t i = 0; i < ignored.size() && i < 4; ++i) s += (i ? ", " : "") + ignored[i];
    if (ignored.size() > 4) s += ", ... (" + std::to_string(ignored.size()) + " in all)";
    out.notes.push_back("ignored " + std::to_string(ignored.size()) + " tensor" + (ignored.size() == 1 ? "" : "s") +
                        " leantrain has no use for: " + s);
  }
  return out;
}

ExportedWeights export_llama(const Options& o, const NamedTensors& ts) {
  const Family* fam = family_named(text_of(o, "family"));
  if (fam == nullptr) throw ConfigError("model.family = \"" + text_of(o, "family") + "\": not llama | qwen2 | qwen3 | mistral");
  check_exportable(o, *fam);
  ExportedWeights e;
  e.format = std::string("Hugging Face ") + fam->arch;
  e.metadata = {{"format", "pt"}};
  std::map<std::string, torch::Tensor> by_name(ts.begin(), ts.end());
  auto need = [&](const std::string& name) {
    auto it = by_name.find(name);
    if (it == by_name.end()) throw DataError("no tensor " + name + " to export as " + e.format);
    return it->second;
  };
  e.tensors.emplace_back("model.embed_tokens.weight", need("embed_tokens.weight"));
  const auto per_layer = layer_tensors(o);
  for (int64_t i = 0; i < int_of(o, "num_hidden_layers"); ++i)
    for (const auto& n : per_layer)
      e.tensors.emplace_back("model.layers." + std::to_string(i) + "." + n, need("blocks." + std::to_string(i) + "." + n));
  e.tensors.emplace_back("model.norm.weight", need("norm.weight"));
  // Tied: no lm_head.weight, as save_pretrained writes a tied model.
  if (!flag_of(o, "tie_word_embeddings")) e.tensors.emplace_back("lm_head.weight", need("lm_head.weight"));
  e.config_json = export_config(o, *fam).dump(2) + "\n";
  return e;
}

}  // namespace lt::models
