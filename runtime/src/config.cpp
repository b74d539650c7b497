// Strict TOML config parsing: every key is declared once in a field table (section, key,
// type, where it lives); the table drives parsing, --set overrides, unknown-key detection
// and the JSON dump, so a new key is one line here.
#include "leantrain/runtime/config.h"

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include "leantrain/runtime/errors.h"

namespace lt {
namespace {

using FieldRef = std::variant<int64_t*, uint64_t*, double*, std::string*, bool*, std::vector<int64_t>*>;

struct Field {
  std::string section, key;
  FieldRef ref;
  // A deprecated spelling of a field listed before it under its own key: read (with a line in
  // Config::warnings), never written (config_to_json writes the field once, under that key)
  // and not offered in the unknown-key messages' lists.
  bool alias = false;
};

std::vector<Field> fields_of(Config& c) {
  auto& t = c.train;
  auto& p = c.precision;
  auto& mem = c.memory;
  auto& ck = c.checkpoint;
  auto& cm = c.comm;
  auto& l = c.log;
  return {
      // [model] and [data]: the kind, and the keys every data kind shares; the rest of each
      // section is the kind's own options (component_options below).
      {"model", "kind", &c.model.kind},
      {"data", "kind", &c.data.kind}, {"data", "seed", &c.data.seed}, {"data", "limit", &c.data.limit},
      {"train", "global_batch", &t.global_batch}, {"train", "micro_batch", &t.micro_batch},
      {"train", "steps", &t.steps}, {"train", "epochs", &t.epochs},
      {"train", "optimizer", &t.optimizer}, {"train", "lr", &t.lr},
      {"train", "min_lr", &t.min_lr}, {"train", "schedule", &t.schedule},
      {"train", "warmup_steps", &t.warmup_steps}, {"train", "weight_decay", &t.weight_decay},
      {"train", "momentum", &t.momentum}, {"train", "beta1", &t.beta1},
      {"train", "beta2", &t.beta2}, {"train", "eps", &t.eps},
      {"train", "grad_clip", &t.grad_clip}, {"train", "eval_batch", &t.eval_batch},
      {"train", "eval_max_batches", &t.eval_max_batches}, {"train", "threads", &t.threads},
      {"train", "device", &t.device}, {"train", "nonfinite", &t.nonfinite},
      {"train", "lr_scaling", &t.lr_scaling}, {"train", "lr_reference_batch", &t.lr_reference_batch},
      {"train", "nonfinite_max_skips", &t.nonfinite_max_skips},
      {"precision", "mode", &p.mode}, {"precision", "init_scale", &p.init_scale},
      {"precision", "growth_factor", &p.growth_factor},
      {"precision", "backoff_factor", &p.backoff_factor},
      {"precision", "growth_interval", &p.growth_interval},
      {"precision", "head_matmul", &p.head_matmul},
      {"precision", "conv_products", &p.conv_products},
      {"memory", "recompute", &mem.recompute},
      {"memory", "activation_checkpoint", &mem.recompute, /*alias=*/true},  // the deprecated spelling
      {"memory", "budget", &mem.budget},
      {"memory", "shard", &mem.shard}, {"memory", "optimizer_state", &mem.optimizer_state},
      {"memory", "grad_accum_dtype", &mem.grad_accum_dtype},
      {"checkpoint", "dir", &ck.dir}, {"checkpoint", "every_steps", &ck.every_steps},
      {"checkpoint", "keep_last", &ck.keep_last}, {"checkpoint", "async", &ck.async},
      {"checkpoint", "at_end", &ck.at_end},
      {"comm", "backend", &cm.backend}, {"comm", "bucket_mb", &cm.bucket_mb},
      {"comm", "first_bucket_mb", &cm.first_bucket_mb}, {"comm", "timeout_s", &cm.timeout_s},
      {"comm", "startup_timeout_s", &cm.startup_timeout_s},
      {"comm", "overlap", &cm.overlap},
      {"log", "every_steps", &l.every_steps}, {"log", "progress", &l.progress},
      {"log", "all_ranks", &l.all_ranks},
  };
}

// The options of a component section ([model], [data]): keys the field table does not list go
// there as given, for the kind's table to check. Null for the other sections.
Options* component_options(Config& c, const std::string& section) {
  if (section == "model") return &c.model.options;
  if (section == "data") return &c.data.options;
  return nullptr;
}

std::string type_name(const FieldRef& r) {
  struct V {
    std::string operator()(int64_t*) const { return "an integer"; }
    std::string operator()(uint64_t*) const { return "a non-negative integer"; }
    std::string operator()(double*) const { return "a number"; }
    std::string operator()(std::string*) const { return "a string"; }
    std::string operator()(bool*) const { return "true or false"; }
    std::string operator()(std::vector<int64_t>*) const { return "an array of integers"; }
  };
  return std::visit(V{}, r);
}

std::string node_type(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a number";
    case toml::node_type::boolean: return "a boolean";
    default: return "a date/time";
  }
}

// Stores a TOML node into a field, or throws naming the key and both types.
void assign(const Field& f, const toml::node& n, const std::string& where) {
  const std::string name = f.section + "." + f.key;
  auto wrong = [&]() {
    return ConfigError(where + name + ": expected " + type_name(f.ref) + ", got " + node_type(n));
  };
  if (auto* p = std::get_if<int64_t*>(&f.ref)) {
    if (!n.is_integer()) throw wrong();
    **p = n.as_integer()->get();
  } else if (auto* p = std::get_if<uint64_t*>(&f.ref)) {
    if (!n.is_integer()) throw wrong();
    int64_t v = n.as_integer()->get();
    if (v < 0) throw ConfigError(where + name + " = " + std::to_string(v) + ": must be >= 0");
    **p = static_cast<uint64_t>(v);
  } else if (auto* p = std::get_if<double*>(&f.ref)) {
    if (n.is_integer()) **p = static_cast<double>(n.as_integer()->get());
    else if (n.is_floating_point()) **p = n.as_floating_point()->get();
    else throw wrong();
  } else if (auto* p = std::get_if<std::string*>(&f.ref)) {
    // A size may also be a plain byte count (memory.budget = 8000000000, --set memory.budget=1550000).
    if (name == "memory.budget" && n.is_integer()) {
      **p = std::to_string(n.as_integer()->get());
      return;
    }
    if (!n.is_string()) throw wrong();
    **p = n.as_string()->get();
  } else if (auto* p = std::get_if<bool*>(&f.ref)) {
    if (!n.is_boolean()) throw wrong();
    **p = n.as_boolean()->get();
  } else if (auto* p = std::get_if<std::vector<int64_t>*>(&f.ref)) {
    if (!n.is_array()) throw wrong();
    std::vector<int64_t> out;
    for (const auto& e : *n.as_array()) {
      if (!e.is_integer()) throw wrong();
      out.push_back(e.as_integer()->get());
    }
    **p = out;
  }
}

// A TOML value as a component option (its TOML type; arrays of integers only).
OptionValue option_of(const toml::node& n, const std::string& name, const std::string& where) {
  if (n.is_boolean()) return n.as_boolean()->get();
  if (n.is_integer()) return n.as_integer()->get();
  if (n.is_floating_point()) return n.as_floating_point()->get();
  if (n.is_string()) return n.as_string()->get();
  if (n.is_array()) {
    std::vector<int64_t> out;
    for (const auto& e : *n.as_array()) {
      if (!e.is_integer()) throw ConfigError(where + name + ": expected an array of integers, got an array holding " + node_type(e));
      out.push_back(e.as_integer()->get());
    }
    return out;
  }
  throw ConfigError(where + name + ": expected a value, got " + node_type(n));
}

std::string known_keys(const std::vector<Field>& fs, const std::string& section) {
  std::string out;
  for (const auto& f : fs)
    if (f.section == section && !f.alias) out += (out.empty() ? "" : ", ") + f.key;
  return out;
}

std::string known_sections(const std::vector<Field>& fs) {
  std::string out;
  for (const auto& f : fs)
    if (out.find(f.section) == std::string::npos) out += (out.empty() ? "" : ", ") + f.section;
  return out;
}

const Field* find_field(const std::vector<Field>& fs, const std::string& section,
                        const std::string& key) {
  for (const auto& f : fs)
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

nlohmann::json to_json(const Field& f);

const void* target_of(const Field& f) {
  return std::visit([](auto* p) { return static_cast<const void*>(p); }, f.ref);
}

// Within one source (the file, or the --set list), the spellings of one field must agree:
// memory.recompute = "full" beside memory.activation_checkpoint = "none" is refused, naming
// both. A later source overrides an earlier one whatever the spelling. A deprecated spelling
// adds one line per source to `warnings`.
class Spellings {
 public:
  Spellings(std::string source, const std::vector<Field>& fs, std::vector<std::string>& warnings)
      : source_(std::move(source)), fs_(fs), warnings_(warnings) {}
  // Called after f was assigned.
  void assigned(const Field& f) {
    const auto target = target_of(f);
    const std::string name = f.section + "." + f.key;
    auto value = to_json(f);
    auto it = seen_.find(target);
    if (it != seen_.end() && it->second.first != name && it->second.second != value)
      throw ConfigError(source_ + ": " + it->second.first + " = " + it->second.second.dump() + " and " + name +
                        " = " + value.dump() + " are two spellings of one setting with different values; give one");
    seen_[target] = {name, std::move(value)};
    if (f.alias && warned_.insert(name).second) {
      for (const auto& g : fs_)
        if (!g.alias && target_of(g) == target) {
          warnings_.push_back(source_ + ": " + name + " is deprecated; write " + g.section + "." + g.key +
                              " (same values)");
          break;
        }
    }
  }

 private:
  std::string source_;
  const std::vector<Field>& fs_;
  std::vector<std::string>& warnings_;
  std::map<const void*, std::pair<std::string, nlohmann::json>> seen_;
  std::set<std::string> warned_;
};

void apply_table(const toml::table& root, std::vector<Field>& fs, Config& cfg, const std::string& src) {
  const std::string where = src + ": ";
  Spellings spellings(src, fs, cfg.warnings);
  for (const auto& [sec_key, sec_node] : root) {
    const std::string section(sec_key.str());
    if (known_keys(fs, section).empty())
      throw ConfigError(where + "unknown section [" + section + "]; allowed: " + known_sections(fs));
    if (!sec_node.is_table())
      throw ConfigError(where + section + ": expected a table [" + section + "], got " +
                        node_type(sec_node));
    for (const auto& [key, node] : *sec_node.as_table()) {
      const Field* f = find_field(fs, section, std::string(key.str()));
      if (!f && component_options(cfg, section)) {
        const std::string k(key.str());
        component_options(cfg, section)->set(k, option_of(node, section + "." + k, where));
        continue;
      }
      if (!f)
        throw ConfigError(where + "unknown key " + section + "." + std::string(key.str()) +
                          "; allowed in [" + section + "]: " + known_keys(fs, section));
      assign(*f, node, where);
      spellings.assigned(*f);
    }
  }
}

void apply_override(const std::string& kv, std::vector<Field>& fs, Config& cfg, Spellings& spellings) {
  const auto eq = kv.find('=');
  const auto dot = kv.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw ConfigError("--set " + kv + ": expected section.key=value (e.g. train.lr=3e-4)");
  const std::string section = kv.substr(0, dot);
  const std::string key = kv.substr(dot + 1, eq - dot - 1);
  const std::string value = kv.substr(eq + 1);
  const Field* f = find_field(fs, section, key);
  if (!f && !component_options(cfg, section)) {
    if (known_keys(fs, section).empty())
      throw ConfigError("--set " + kv + ": unknown section '" + section +
                        "'; allowed: " + known_sections(fs));
    throw ConfigError("--set " + kv + ": unknown key " + section + "." + key + "; allowed in [" +
                      section + "]: " + known_keys(fs, section));
  }
  // The value is TOML (3e-4, true, [1,2], "x"); a bare word like `gpt` is taken as a string.
  toml::table t;
  try {
    t = toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    t = toml::table{{"v", value}};
  }
  if (!f) {
    component_options(cfg, section)->set(key, option_of(*t.get("v"), section + "." + key, "--set "));
    return;
  }
  assign(*f, *t.get("v"), "--set ");
  spellings.assigned(*f);
}

nlohmann::json to_json(const Field& f) {
  return std::visit([](auto* p) { return nlohmann::json(*p); }, f.ref);
}

std::string quote(const std::string& s) { return "'" + s + "'"; }

[[noreturn]] void bad(const std::string& key, const std::string& value, const std::string& rule) {
  throw ConfigError(key + " = " + value + ": " + rule);
}

void positive(const std::string& key, int64_t v) {
  if (v <= 0) bad(key, std::to_string(v), "must be a positive integer");
}
void non_negative(const std::string& key, int64_t v) {
  if (v < 0) bad(key, std::to_string(v), "must be >= 0");
}
void non_negative(const std::string& key, double v) {
  if (!(v >= 0) || !std::isfinite(v)) bad(key, std::to_string(v), "must be a finite number >= 0");
}
void one_of(const std::string& key, const std::string& v, std::initializer_list<const char*> allowed) {
  std::string list;
  for (const char* a : allowed) {
    if (v == a) return;
    list += (list.empty() ? "" : " | ") + std::string(a);
  }
  bad(key, quote(v), "allowed: " + list);
}

}  // namespace

Config parse_config(const std::string& toml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  Config cfg;
  auto fs = fields_of(cfg);
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw ConfigError(source_name + ":" + std::to_string(b.line) + ":" + std::to_string(b.column) +
                      ": TOML syntax error: " + std::string(e.description()));
  }
  apply_table(root, fs, cfg, source_name);
  Spellings spellings("--set", fs, cfg.warnings);
  for (const auto& kv : overrides) apply_override(kv, fs, cfg, spellings);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) throw ConfigError("--config " + path + ": cannot open the file (does it exist?)");
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_config(ss.str(), path, overrides);
}

int64_t parse_bytes(const std::string& text) {
  static const std::map<std::string, double> units = {
      {"", 1},          {"B", 1},           {"KB", 1e3},          {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},       {"KIB", 1024.0},      {"MIB", 1048576.0},
      {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}, {"K", 1024.0}, {"M", 1048576.0},
      {"G", 1073741824.0}};
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw std::invalid_argument("'" + text + "' is not a size (e.g. 8GiB, 512MiB, 1000000)");
  }
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  for (auto& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  auto it = units.find(unit);
  if (it == units.end() || !(v >= 0) || !std::isfinite(v))
    throw std::invalid_argument("'" + text + "' is not a size (e.g. 8GiB, 512MiB, 1000000)");
  return static_cast<int64_t>(v * it->second);
}

int64_t accumulation_steps(const TrainConfig& t, int world_size) {
  return t.global_batch / (t.micro_batch * world_size);
}

void validate(const Config& c, int world_size) {
  non_negative("data.limit", c.data.limit);

  const auto& t = c.train;
  positive("train.global_batch", t.global_batch);
  positive("train.micro_batch", t.micro_batch);
  non_negative("train.steps", t.steps);
  non_negative("train.epochs", t.epochs);
  if (t.steps == 0 && t.epochs == 0)
    bad("train.steps", "0", "set train.steps or train.epochs to a positive number");
  one_of("train.optimizer", t.optimizer, {"adamw", "sgd"});
  one_of("train.schedule", t.schedule, {"cosine", "constant"});
  one_of("train.device", t.device, {"auto", "cpu", "cuda"});
  if (!(t.lr > 0) || !std::isfinite(t.lr)) bad("train.lr", std::to_string(t.lr), "must be > 0");
  non_negative("train.min_lr", t.min_lr);
  if (t.min_lr > t.lr) bad("train.min_lr", std::to_string(t.min_lr), "must be <= train.lr");
  non_negative("train.warmup_steps", t.warmup_steps);
  non_negative("train.weight_decay", t.weight_decay);
  non_negative("train.grad_clip", t.grad_clip);
  if (!(t.momentum >= 0 && t.momentum < 1)) bad("train.momentum", std::to_string(t.momentum), "must be in [0, 1)");
  if (!(t.beta1 >= 0 && t.beta1 < 1)) bad("train.beta1", std::to_string(t.beta1), "must be in [0, 1)");
  if (!(t.beta2 >= 0 && t.beta2 < 1)) bad("train.beta2", std::to_string(t.beta2), "must be in [0, 1)");
  if (!(t.eps > 0)) bad("train.eps", std::to_string(t.eps), "must be > 0");
  positive("train.eval_batch", t.eval_batch);
  non_negative("train.eval_max_batches", t.eval_max_batches);
  non_negative("train.threads", t.threads);
  one_of("train.nonfinite", t.nonfinite, {"stop", "skip"});
  one_of("train.lr_scaling", t.lr_scaling, {"none", "linear"});
  non_negative("train.lr_reference_batch", t.lr_reference_batch);
  if (t.lr_scaling == "linear" && t.lr_reference_batch <= 0)
    bad("train.lr_reference_batch", std::to_string(t.lr_reference_batch),
        "train.lr_scaling = 'linear' needs the global batch train.lr was tuned for (e.g. " +
            std::to_string(t.global_batch) + ")");
  non_negative("train.nonfinite_max_skips", t.nonfinite_max_skips);
  const int64_t per_step = t.micro_batch * world_size;
  if (t.global_batch % per_step != 0)
    bad("train.global_batch", std::to_string(t.global_batch),
        "must be divisible by train.micro_batch x world size = " + std::to_string(t.micro_batch) +
            " x " + std::to_string(world_size) + " = " + std::to_string(per_step) +
            " (e.g. " + std::to_string(per_step * std::max<int64_t>(1, t.global_batch / per_step)) + ")");

  const auto& p = c.precision;
  one_of("precision.mode", p.mode, {"fp32", "bf16", "fp16"});
  one_of("precision.head_matmul", p.head_matmul, {"auto", "autocast", "fp32"});
  one_of("precision.conv_products", p.conv_products, {"auto", "autocast", "fp32"});
  if (!(p.init_scale > 0)) bad("precision.init_scale", std::to_string(p.init_scale), "must be > 0");
  if (!(p.growth_factor > 1)) bad("precision.growth_factor", std::to_string(p.growth_factor), "must be > 1");
  if (!(p.backoff_factor > 0 && p.backoff_factor < 1))
    bad("precision.backoff_factor", std::to_string(p.backoff_factor), "must be in (0, 1)");
  positive("precision.growth_interval", p.growth_interval);

  const auto& mem = c.memory;
  try {
    parse_bytes(mem.budget);
  } catch (const std::invalid_argument& e) {
    bad("memory.budget", quote(mem.budget), e.what());
  }
  // "auto": the planner's to choose (train --auto / leantrain plan); the Trainer refuses it.
  one_of("memory.shard", mem.shard, {"none", "optimizer", "gradients", "auto"});
  one_of("memory.optimizer_state", mem.optimizer_state, {"fp32", "int8", "auto"});
  if (mem.optimizer_state == "int8" && t.optimizer != "adamw")
    bad("memory.optimizer_state", quote(mem.optimizer_state),
        "8-bit state is AdamW's moments; train.optimizer = '" + t.optimizer + "' keeps fp32 state");
  // Read under memory.shard = gradients only (the other stages keep fp32 gradients in .grad);
  // not an error elsewhere, as `train --auto` may choose another stage for a config that sets it.
  one_of("memory.grad_accum_dtype", mem.grad_accum_dtype, {"fp32", "bf16"});

  non_negative("checkpoint.every_steps", c.checkpoint.every_steps);
  positive("checkpoint.keep_last", c.checkpoint.keep_last);
  if (!(c.comm.bucket_mb > 0)) bad("comm.bucket_mb", std::to_string(c.comm.bucket_mb), "must be > 0");
  if (!(c.comm.first_bucket_mb > 0))
    bad("comm.first_bucket_mb", std::to_string(c.comm.first_bucket_mb), "must be > 0");
  if (!(c.comm.timeout_s > 0)) bad("comm.timeout_s", std::to_string(c.comm.timeout_s), "must be > 0");
  if (!(c.comm.startup_timeout_s >= c.comm.timeout_s))
    bad("comm.startup_timeout_s", std::to_string(c.comm.startup_timeout_s),
        "must be >= comm.timeout_s = " + std::to_string(c.comm.timeout_s) +
            " (it covers setup, the first step and the steps after an evaluation or a checkpoint)");
  positive("log.every_steps", c.log.every_steps);
  one_of("log.progress", c.log.progress, {"auto", "bar", "plain", "none"});
}

std::string config_to_json(const Config& cfg) {
  Config copy = cfg;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : fields_of(copy))
    if (!f.alias) j[f.section][f.key] = to_json(f);
  for (const char* section : {"model", "data"})
    for (const auto& [key, value] : component_options(copy, section)->values())
      j[section][key] = std::visit([](const auto& v) { return nlohmann::json(v); }, value);
  return j.dump();
}

}  // namespace lt
