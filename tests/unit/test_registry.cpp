// The registries (models/registry.h, data/registry.h): the kinds' option tables resolve,
// check and document the [model] and [data] keys; a user's kinds train through the same
// path as the built-ins; data and model meet through the input contract.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "leantrain/comm/communicator.h"
#include "leantrain/data/registry.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/trainer.h"
#include "expect_error.h"

namespace {

using lt_test::config_error;

lt::Config parsed(const std::vector<std::string>& sets) { return lt::parse_config("", "t.toml", sets); }

TEST(Registry, ResolveFillsTheKindsDefaults) {
  const auto c = lt::trainers::resolve_components(parsed({"model.kind=gpt", "model.n_layer=3", "data.kind=text"}));
  EXPECT_EQ(c.model.options.integer("n_layer"), 3);
  EXPECT_EQ(c.model.options.integer("d_model"), 64);             // ModelConfig's default
  EXPECT_DOUBLE_EQ(c.model.options.number("dropout"), 0.0);
  EXPECT_FALSE(c.model.options.has("hidden"));                   // an mlp key: not gpt's
  EXPECT_EQ(c.data.options.text("path"), "/usr/share/games/fortunes");  // text's own default
  EXPECT_DOUBLE_EQ(c.data.options.number("eval_fraction"), 0.1);
  // An empty kind is the registry's default; config.json records every option.
  const auto d = lt::trainers::resolve_components(lt::Config{});
  EXPECT_EQ(d.model.kind, "mlp");
  EXPECT_EQ(d.data.kind, "fashion_mnist");
  const auto j = nlohmann::json::parse(lt::config_to_json(d));
  EXPECT_EQ(j["model"]["hidden"], nlohmann::json::array({256, 256}));
  EXPECT_EQ(j["data"]["path"], "/usr/share/datasets/fashion-mnist");
  EXPECT_EQ(j["data"].size(), 4u);  // kind, seed, limit, path
  // Resolving twice changes nothing (the CLI resolves, then make_components again).
  EXPECT_EQ(lt::config_to_json(lt::trainers::resolve_components(d)), lt::config_to_json(d));
}

TEST(Registry, EachKeyIsCheckedByItsKindAndNamed) {
  auto resolve = [](std::vector<std::string> sets) { lt::trainers::resolve_components(parsed(sets)); };
  // A key no model kind has is refused, listing the kind's keys; a key of another kind (a
  // config switched with --set model.kind=...) is dropped, and config.json does not record it.
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=gpt", "model.hiden=[3]"}); }),
                  "unknown key model.hiden for model.kind = \"gpt\"; its keys: vocab_size, seq_len");
  const auto switched = lt::trainers::resolve_components(parsed({"model.kind=gpt", "model.hidden=[3]"}));
  EXPECT_FALSE(switched.model.options.has("hidden"));
  EXPECT_EQ(nlohmann::json::parse(lt::config_to_json(switched))["model"].count("hidden"), 0u);
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=gpt", "model.d_model=0"}); }),
                  "model.d_model = 0: must be >= 1");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=gpt", "model.d_model=100", "model.n_head=3"}); }),
                  "model.n_head = 3: must divide model.d_model = 100");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=bert", "model.n_layer=\"4\""}); }),
                  "model.n_layer: expected an integer, got a string");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.hidden=[8, -1]"}); }), "model.hidden = [8, -1]: every entry must be >= 1 (entry 1)");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=resnet", "model.depth=20"}); }), "model.depth = 20");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=resnet", "model.stem=big"}); }),
                  "model.stem = \"big\": allowed: imagenet | small");
  EXPECT_CONTAINS(config_error([&] { resolve({"model.kind=gemma"}); }),
                  "model.kind = \"gemma\": no such model kind; registered: mlp | gpt | bert | resnet | llama");
  EXPECT_CONTAINS(config_error([&] { resolve({"data.kind=text", "data.eval_fraction=1"}); }),
                  "data.eval_fraction = 1.0: must be in [0, 1)");
  EXPECT_CONTAINS(config_error([&] { resolve({"data.kind=text", "data.mask_prob=0"}); }),
                  "data.mask_prob = 0.0: must be in (0, 1]");
  EXPECT_CONTAINS(config_error([&] { resolve({"data.path=\"\""}); }), "data.path = \"\": give a path");
  EXPECT_CONTAINS(config_error([&] { resolve({"data.kind=synthetic", "data.paht=/x"}); }),
                  "unknown key data.paht for data.kind = \"synthetic\"; its keys: synthetic_samples, mask_prob");
  EXPECT_NO_THROW(resolve({"data.kind=synthetic", "data.path=/x"}));  // fashion_mnist's and text's key
  // An integer where a number is expected is taken.
  EXPECT_NO_THROW(resolve({"model.dropout=0"}));
}

// ---- A user's kinds: registered by name, trained through make_components -------------------

struct Doubler {
  int64_t width = 4;
  int64_t scale = 2;
};

// A model that reads a named input field ("scale"): loss = mean((w.x * scale - y)^2)-ish, as a
// classifier over 2 classes so the trainer's evaluation applies.
class FieldModel : public lt::models::Model {
 public:
  explicit FieldModel(int64_t width) { lin_ = register_module("lin", torch::nn::Linear(width, 2)); }
  torch::Tensor forward(const torch::Tensor& x) override { return lin_(x); }
  torch::Tensor forward_with(const torch::Tensor& x, const lt::models::TensorMap& f) override {
    ++calls_with_field;
    return lin_(x * f.at("scale"));
  }
  torch::Tensor forward_loss_with(const torch::Tensor& x, const torch::Tensor& y,
                                  const lt::models::TensorMap& f) override {
    return lt::models::compute_loss(task(), forward_with(x, f), y);
  }
  lt::models::Task task() const override { return lt::models::Task::kClassify; }
  static inline int calls_with_field = 0;

 private:
  torch::nn::Linear lin_{nullptr};
};

class FieldData : public lt::data::Dataset {
 public:
  FieldData(int64_t n, int64_t width, bool with_field) : n_(n), width_(width), with_field_(with_field) {}
  int64_t size() const override { return n_; }
  lt::data::Batch get(const std::vector<int64_t>& idx, int64_t) const override {
    lt::data::Batch b;
    const auto B = static_cast<int64_t>(idx.size());
    auto i = torch::tensor(idx, torch::kLong).to(torch::kFloat).unsqueeze(1);
    b.input = torch::cos(i * torch::arange(1, width_ + 1, torch::kFloat));
    b.target = (torch::tensor(idx, torch::kLong) % 2);
    if (with_field_) b.fields["scale"] = torch::full({B, 1}, 0.5f);
    return b;
  }
  std::string describe() const override { return "field data: " + std::to_string(n_) + " rows"; }
  std::vector<std::string> fields() const override {
    return with_field_ ? std::vector<std::string>{"scale"} : std::vector<std::string>{};
  }

 private:
  int64_t n_, width_;
  bool with_field_;
};

void register_test_kinds() {
  static bool done = false;
  if (done) return;
  done = true;
  lt::BoundOptions<Doubler> opts;
  opts.add("width", &Doubler::width, "input width", lt::rules::at_least(1));
  lt::models::ModelKind m;
  m.name = "test_field_model";
  m.doc = "A test model reading the field \"scale\".";
  m.options = opts.table();
  m.contract = [opts](const lt::Options& o) {
    lt::InputContract c;
    c.channels = 1;
    c.height = 1;
    c.width = opts.read(o).width;
    c.num_classes = 2;
    c.fields = {"scale"};
    return c;
  };
  m.build = [opts](const lt::Options& o) { return std::make_shared<FieldModel>(opts.read(o).width); };
  lt::models::register_model(m);
  EXPECT_THROW(lt::models::register_model(m), std::invalid_argument);  // the name is taken

  for (bool with_field : {true, false}) {
    lt::data::DataKind d;
    d.name = with_field ? "test_field_data" : "test_fieldless_data";
    d.doc = "Test rows.";
    d.options = {{"rows", lt::OptionValue(int64_t{64}), "rows", lt::rules::at_least(1)}};
    d.make = [with_field](const lt::Options& o, uint64_t, const lt::InputContract& model) {
      return lt::data::Datasets{std::make_shared<FieldData>(o.integer("rows"), model.width, with_field),
                                std::make_shared<FieldData>(16, model.width, with_field)};
    };
    lt::data::register_data(d);
  }
}

TEST(Registry, AUsersKindsTrainThroughTheSamePathAsTheBuiltIns) {
  register_test_kinds();
  const auto cfg = lt::trainers::resolve_components(parsed(
      {"model.kind=test_field_model", "model.width=6", "data.kind=test_field_data", "data.rows=32", "data.limit=24",
       "train.global_batch=8", "train.micro_batch=4", "train.steps=3", "train.device=cpu", "train.threads=1",
       "comm.backend=local", "log.progress=none"}));
  lt::validate(cfg, 1);
  const auto j = nlohmann::json::parse(lt::config_to_json(cfg));
  EXPECT_EQ(j["model"], nlohmann::json({{"kind", "test_field_model"}, {"width", 6}}));
  EXPECT_EQ(j["data"], nlohmann::json({{"kind", "test_field_data"}, {"rows", 32}, {"seed", 1234}, {"limit", 24}}));

  const auto ctx = lt::make_runtime_context(cfg, lt::World{});
  lt::comm::LocalCommunicator local;
  auto parts = lt::trainers::make_components(cfg);
  EXPECT_EQ(parts.train->size(), 24);  // data.limit, applied to any kind
  EXPECT_EQ(parts.name, "model test_field_model");
  FieldModel::calls_with_field = 0;
  lt::trainers::Trainer trainer(cfg, parts, ctx, local);
  const auto s = trainer.run();
  EXPECT_EQ(s.steps, 3);
  EXPECT_TRUE(std::isfinite(s.final_loss));
  // 3 steps x 2 micro-batches, plus the evaluation's batches: every forward saw the field.
  EXPECT_GE(FieldModel::calls_with_field, 6);

  // A data kind without the field the model reads is refused before training, naming it.
  auto without = cfg;
  without.data.kind = "test_fieldless_data";
  EXPECT_CONTAINS(config_error([&] { lt::trainers::make_components(without); }),
                  "the model reads the input field \"scale\", which data.kind = \"test_fieldless_data\" does not give");
  // The registered kinds are documented like the built-ins.
  EXPECT_CONTAINS(lt::trainers::registered_options_markdown(), "### [model] kind = \"test_field_model\"");
}

TEST(Registry, DataAndModelMeetThroughTheContract) {
  // Built-in data refuses a contract it cannot serve, naming both sides and the key to change.
  auto msg = config_error([] { lt::trainers::make_components(parsed({"model.kind=gpt", "data.kind=fashion_mnist"})); });
  EXPECT_CONTAINS(msg, "data.kind = 'fashion_mnist' gives images [B,1,28,28] with labels of 10 classes");
  EXPECT_CONTAINS(msg, "the model takes tokens [B,128] with ids < 257, next-token targets");
  msg = config_error([] { lt::trainers::make_components(parsed({"model.kind=mlp", "model.num_classes=7"})); });
  EXPECT_CONTAINS(msg, "model.num_classes = 7, but Fashion-MNIST (10 classes) gives 10 (set model.num_classes = 10)");
  // The contracts of the built-ins.
  const auto bert = lt::models::model_contract(lt::trainers::resolve_components(parsed({"model.kind=bert"})).model);
  EXPECT_EQ(bert.input, lt::InputContract::Input::kTokens);
  EXPECT_EQ(bert.target, lt::InputContract::Target::kMaskedTokens);
  EXPECT_EQ(bert.seq_len, 128);
  const auto resnet = lt::models::model_contract(
      lt::trainers::resolve_components(parsed({"model.kind=resnet", "model.in_channels=3", "model.image_size=32"})).model);
  EXPECT_EQ(resnet.describe(), "images [B,3,32,32], labels of 10 classes");
}

}  // namespace

// docs/CONFIG.md is held to the parser's one table of keys (runtime/src/config.cpp, fields_of)
// and to the default kinds' tables: every key config.json writes for the default config is
// documented under its section, every documented key parses, and each documented default,
// given with --set, leaves the resolved config unchanged. The sections of the registered kinds
// (### [model] kind = ...) are generated: KindSectionsAreTheRegistryOutput.
namespace {
std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t`"), e = s.find_last_not_of(" \t`");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}
std::vector<std::string> split_top(const std::string& s) {  // "2, 2, 64" and "[256, 256]"
  std::vector<std::string> out;
  int depth = 0;
  std::string cur;
  for (char ch : s) {
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (ch == ',' && depth == 0) {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += ch;
    }
  }
  out.push_back(trim(cur));
  return out;
}
}  // namespace

TEST(ConfigDoc, DocumentsEveryKeyWithItsDefault) {
  std::ifstream in(std::string(LEANTRAIN_SOURCE_DIR) + "/docs/CONFIG.md");
  ASSERT_TRUE(in) << "docs/CONFIG.md";
  // "<kind override> section.key" -> default as written. The kind override is empty for the
  // "## [section]" tables, "model.kind=gpt" under "### [model] kind = "gpt"" (a kind's table:
  // its defaults hold with that kind).
  std::map<std::pair<std::string, std::string>, std::string> documented;
  std::string section, kind_set;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) {  // "## [train]"; any other heading ends the section
      kind_set.clear();
      section = line.rfind("## [", 0) != 0                  ? ""
                : line.find("], [") != std::string::npos ? "*"  // several sections: rows say which
                                                         : line.substr(4, line.find(']') - 4);
      if (line.rfind("### [", 0) == 0 && line.find("] kind = \"") != std::string::npos) {
        section = line.substr(5, line.find(']') - 5);
        const auto q = line.find('"');
        kind_set = section + ".kind=" + line.substr(q + 1, line.rfind('"') - q - 1);
      }
      continue;
    }
    if (section.empty() || line.rfind("| ", 0) != 0 || line.rfind("| key", 0) == 0) continue;
    std::vector<std::string> cells;
    for (size_t at = 1, bar; (bar = line.find(" | ", at)) != std::string::npos || at < line.size(); at = bar + 3) {
      if (bar == std::string::npos) break;
      cells.push_back(trim(line.substr(at, bar - at)));
    }
    if (cells.size() < 3) continue;
    const auto keys = split_top(cells[0]), defaults = split_top(cells[2]);
    // Under "## [checkpoint], [comm], [log]" a row names its section: "comm.bucket_mb,
    // first_bucket_mb" (the keys after the first share its section).
    std::string sec = section;
    for (size_t i = 0; i < keys.size(); ++i) {
      std::string key = keys[i];
      if (section == "*") {
        const auto dot = key.find('.');
        if (dot != std::string::npos) sec = key.substr(0, dot), key = key.substr(dot + 1);
      }
      documented[{kind_set, sec + "." + key}] = keys.size() == defaults.size() ? defaults[i] : cells[2];
    }
  }
  auto resolved = [](const std::vector<std::string>& sets) {
    return nlohmann::json::parse(
        lt::config_to_json(lt::trainers::resolve_components(lt::parse_config("", "docs/CONFIG.md", sets))));
  };
  const auto defaults = resolved({});
  for (const auto& [sec, keys] : defaults.items())
    for (const auto& [key, value] : keys.items()) {
      const std::string kind_set = keys.contains("kind") ? sec + ".kind=" + keys["kind"].get<std::string>() : "";
      EXPECT_TRUE(documented.count({"", sec + "." + key}) || documented.count({kind_set, sec + "." + key}))
          << sec << "." << key << " (default " << value.dump() << ") is not in docs/CONFIG.md";
    }
  // A kind's required options (a string its rule refuses empty, e.g. token_shards' data.train)
  // get a value in every check of that kind; their own row is checked to be refused alone.
  std::map<std::string, std::vector<std::string>> required;  // kind_set -> "key=value"
  for (const auto& [where, value] : documented) {
    const auto& [kind_set, name] = where;
    if (kind_set.empty() || value != "\"\"") continue;
    try {
      resolved({kind_set, name + "=" + value});
    } catch (const lt::ConfigError& e) {
      if (std::string(e.what()).rfind(name + " = ", 0) == 0) required[kind_set].push_back(name + "=\"required\"");
    }
  }
  for (const auto& [where, value] : documented) {
    const auto& [kind_set, name] = where;
    SCOPED_TRACE(kind_set + " " + name + " = " + value);
    std::vector<std::string> base;
    if (!kind_set.empty()) base.push_back(kind_set);
    bool is_required = false;
    for (const auto& r : required[kind_set]) {
      is_required |= r.rfind(name + "=", 0) == 0;
      base.push_back(r);
    }
    if (is_required) continue;  // refused alone (above); its value is the placeholder
    auto with = base;
    with.push_back(name + "=" + value);
    try {
      EXPECT_EQ(resolved(with), resolved(base)) << "the documented default is not the default";
    } catch (const lt::ConfigError& e) {
      ADD_FAILURE() << "the documented key or default does not parse: " << e.what();
    }
  }
  EXPECT_EQ(required["data.kind=token_shards"], std::vector<std::string>{"data.train=\"required\""});
  EXPECT_GT(documented.size(), 80u);
}

TEST(ConfigDoc, KindSectionsAreTheRegistryOutput) {
  // docs/CONFIG.md holds `leantrain options` (the built-in kinds) between two markers.
  std::ifstream in(std::string(LEANTRAIN_SOURCE_DIR) + "/docs/CONFIG.md");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string doc = ss.str(), begin = "<!-- BEGIN leantrain options -->\n", end = "<!-- END leantrain options -->";
  const auto b = doc.find(begin), e = doc.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/CONFIG.md has no " << begin;
  ASSERT_NE(e, std::string::npos) << "docs/CONFIG.md has no " << end;
  std::string built_in;
  for (const auto& name : lt::models::model_kind_names())
    if (name.rfind("test_", 0) != 0) {
      const auto& k = lt::models::model_kind(name);
      built_in += lt::options_markdown("model", k.name, k.doc, k.options) + "\n";
    }
  for (const auto& name : lt::data::data_kind_names())
    if (name.rfind("test_", 0) != 0) {
      const auto& k = lt::data::data_kind(name);
      built_in += lt::options_markdown("data", k.name, k.doc, k.options) + "\n";
    }
  EXPECT_EQ(doc.substr(b + begin.size(), e - b - begin.size()), built_in)
      << "docs/CONFIG.md's kind sections differ from `leantrain options`: regenerate them (docs/CONFIG.md says how)";
}

TEST(ShippedConfigs, EveryConfigParsesResolvesAndValidates) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(LEANTRAIN_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(lt::validate(lt::trainers::resolve_components(lt::load_config(e.path().string())), 1));
    ++n;
  }
  EXPECT_GE(n, 7);
}
