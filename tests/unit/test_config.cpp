// Config parsing and validation: every rejection names the key and what is allowed.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"

namespace {

// Runs f, expects a ConfigError, returns its message.
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const lt::ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected lt::ConfigError";
  return "";
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(ConfigParse, ReadsValuesAndKeepsDefaults) {
  auto c = lt::parse_config(R"(
[model]
kind = "gpt"
n_layer = 4
hidden = [8, 4]
[train]
lr = 3e-4
global_batch = 64
[log]
all_ranks = true
)", "t.toml");
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{8, 4}));
  EXPECT_DOUBLE_EQ(c.train.lr, 3e-4);
  EXPECT_EQ(c.train.global_batch, 64);
  EXPECT_TRUE(c.log.all_ranks);
  EXPECT_EQ(c.train.micro_batch, 64);  // default
}

TEST(ConfigParse, IntegerAcceptedWhereNumberExpected) {
  auto c = lt::parse_config("[train]\nlr = 1\n", "t.toml");
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);
}

TEST(ConfigParse, UnknownKeyIsNamedWithAllowedKeys) {
  auto msg = config_error([] { lt::parse_config("[train]\nlearning_rate = 0.1\n", "t.toml"); });
  EXPECT_CONTAINS(msg, "unknown key train.learning_rate");
  EXPECT_CONTAINS(msg, "lr");
  EXPECT_CONTAINS(msg, "t.toml");
}

TEST(ConfigParse, UnknownSectionIsNamed) {
  auto msg = config_error([] { lt::parse_config("[trainer]\nlr = 0.1\n", "t.toml"); });
  EXPECT_CONTAINS(msg, "unknown section [trainer]");
}

TEST(ConfigParse, WrongTypeNamesKeyAndBothTypes) {
  auto msg = config_error([] { lt::parse_config("[train]\nmicro_batch = \"8\"\n", "t.toml"); });
  EXPECT_CONTAINS(msg, "train.micro_batch");
  EXPECT_CONTAINS(msg, "expected an integer, got a string");
  msg = config_error([] { lt::parse_config("[model]\nhidden = [1, \"x\"]\n", "t.toml"); });
  EXPECT_CONTAINS(msg, "model.hidden");
}

TEST(ConfigParse, SyntaxErrorNamesLine) {
  auto msg = config_error([] { lt::parse_config("[train]\nlr = = 3\n", "bad.toml"); });
  EXPECT_CONTAINS(msg, "bad.toml:2");
}

TEST(ConfigParse, OverridesApplyAfterFileWithTomlTypes) {
  auto c = lt::parse_config("[train]\nlr = 0.1\n", "t.toml",
                            {"train.lr=0.5", "model.kind=gpt", "model.hidden=[3]", "log.all_ranks=true"});
  EXPECT_DOUBLE_EQ(c.train.lr, 0.5);
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{3}));
  EXPECT_TRUE(c.log.all_ranks);
}

TEST(ConfigParse, BadOverridesAreNamed) {
  EXPECT_CONTAINS(config_error([] { lt::parse_config("", "t", {"train.lr"}); }), "section.key=value");
  EXPECT_CONTAINS(config_error([] { lt::parse_config("", "t", {"train.foo=1"}); }), "unknown key train.foo");
  EXPECT_CONTAINS(config_error([] { lt::parse_config("", "t", {"train.steps=abc"}); }), "train.steps");
}

TEST(ConfigParse, MissingFileIsConfigError) {
  EXPECT_CONTAINS(config_error([] { lt::load_config("/nonexistent/x.toml"); }), "/nonexistent/x.toml");
}

lt::Config valid() {
  lt::Config c;
  c.train.global_batch = 64;
  c.train.micro_batch = 16;
  return c;
}

TEST(ConfigValidate, DefaultsAreValid) { EXPECT_NO_THROW(lt::validate(valid(), 1)); }

TEST(ConfigValidate, GlobalBatchMustDivideByMicroTimesWorld) {
  auto c = valid();
  c.train.global_batch = 48;
  EXPECT_NO_THROW(lt::validate(c, 1));
  auto msg = config_error([&] { lt::validate(c, 2); });  // 48 % (16*2) != 0
  EXPECT_CONTAINS(msg, "train.global_batch = 48");
  EXPECT_CONTAINS(msg, "16 x 2 = 32");
  EXPECT_EQ(lt::accumulation_steps(c.train, 1), 3);
}

TEST(ConfigValidate, NegativeAndZeroSizesAreNamed) {
  auto c = valid();
  c.train.micro_batch = -4;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "train.micro_batch = -4: must be a positive integer");
  c = valid();
  c.model.d_model = 0;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "model.d_model");
  c = valid();
  c.model.hidden = {8, -1};
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "model.hidden");
  c = valid();
  c.train.lr = -1;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "train.lr");
}

TEST(ConfigValidate, EnumsListAllowedValues) {
  auto c = valid();
  c.precision.mode = "fp8";
  auto msg = config_error([&] { lt::validate(c, 1); });
  EXPECT_CONTAINS(msg, "precision.mode = 'fp8'");
  EXPECT_CONTAINS(msg, "fp32 | bf16 | fp16");
}

TEST(ConfigValidate, EmptyDataPathIsNamed) {
  auto c = valid();
  c.data.path = "";
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "data.path");
  c.data.kind = "synthetic";
  EXPECT_NO_THROW(lt::validate(c, 1));
}

// Keys owned by another component are checked there, once (config.h: validate): runtime
// leaves their values alone (tests/unit/test_models.cpp, test_data.cpp check them).
TEST(ConfigValidate, KeysOfOtherComponentsAreLeftToThem) {
  auto c = valid();
  c.model.d_model = 100;
  c.model.n_head = 3;                          // models::check_model_config
  c.memory.activation_checkpoint = "every:0";  // models::RecomputePolicy::parse
  c.data.eval_fraction = 0;                    // data::make_datasets (0: nothing held out)
  c.data.mask_prob = 1;
  c.comm.backend = "carrier-pigeon";           // comm::choose_backend
  EXPECT_NO_THROW(lt::validate(c, 1));
}

TEST(ConfigValidate, FaultPoliciesAndDeadlines) {
  auto c = valid();
  c.train.nonfinite = "ignore";
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "train.nonfinite = 'ignore': allowed: stop | skip");
  c = valid();
  c.train.nonfinite_max_skips = -1;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "train.nonfinite_max_skips");
  c = valid();
  c.comm.timeout_s = 600;
  c.comm.startup_timeout_s = 60;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "comm.startup_timeout_s = 60");
  c.comm.startup_timeout_s = 600;
  EXPECT_NO_THROW(lt::validate(c, 1));
  c = valid();
  c.train.lr_scaling = "linear";
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "train.lr_reference_batch = 0: train.lr_scaling = 'linear' needs");
  c.train.lr_reference_batch = 64;
  EXPECT_NO_THROW(lt::validate(c, 1));
}

TEST(ParseBytes, UnitsAndErrors) {
  EXPECT_EQ(lt::parse_bytes("8GiB"), 8LL << 30);
  EXPECT_EQ(lt::parse_bytes("512MiB"), 512LL << 20);
  EXPECT_EQ(lt::parse_bytes("1.5GB"), 1500000000LL);
  EXPECT_EQ(lt::parse_bytes("1000"), 1000);
  EXPECT_THROW(lt::parse_bytes("8 parsecs"), std::invalid_argument);
  EXPECT_THROW(lt::parse_bytes("lots"), std::invalid_argument);
  auto c = valid();
  c.memory.budget = "lots";
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "memory.budget");
}

TEST(ParseBytes, BudgetTakesAStringSizeOrAPlainByteCount) {
  EXPECT_EQ(lt::parse_config("[memory]\nbudget = \"2GiB\"\n", "t").memory.budget, "2GiB");
  EXPECT_EQ(lt::parse_config("[memory]\nbudget = 1550000\n", "t").memory.budget, "1550000");
  EXPECT_EQ(lt::parse_config("", "t", {"memory.budget=1550000"}).memory.budget, "1550000");
  EXPECT_EQ(lt::parse_config("", "t", {"memory.budget=8GiB"}).memory.budget, "8GiB");
  EXPECT_EQ(lt::parse_bytes(lt::parse_config("", "t", {"memory.budget=1550000"}).memory.budget), 1550000);
  EXPECT_CONTAINS(config_error([&] { lt::parse_config("[memory]\nbudget = 1.5\n", "t"); }),
                  "memory.budget: expected a string");
}

// memory.recompute is the preferred spelling of memory.activation_checkpoint: either fills
// the one field; both with different values in one source (the file, or the --set list) are
// refused naming both keys; --set overrides the file whatever the spelling; config.json
// writes the field once, as activation_checkpoint.
TEST(ConfigParse, RecomputeIsAnAliasOfActivationCheckpoint) {
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"selective\"\n", "t").memory.activation_checkpoint, "selective");
  EXPECT_EQ(lt::parse_config("[memory]\nactivation_checkpoint = \"full\"\n", "t").memory.activation_checkpoint,
            "full");
  EXPECT_EQ(lt::parse_config("", "t", {"memory.recompute=every:2"}).memory.activation_checkpoint, "every:2");
  // The same value under both spellings is no conflict.
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"full\"\nactivation_checkpoint = \"full\"\n", "t")
                .memory.activation_checkpoint,
            "full");
  // --set overrides the file, in either spelling.
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"selective\"\n", "t", {"memory.activation_checkpoint=full"})
                .memory.activation_checkpoint,
            "full");
  EXPECT_EQ(lt::parse_config("[memory]\nactivation_checkpoint = \"selective\"\n", "t", {"memory.recompute=none"})
                .memory.activation_checkpoint,
            "none");
  auto j = lt::config_to_json(lt::parse_config("[memory]\nrecompute = \"selective\"\n", "t"));
  EXPECT_CONTAINS(j, "\"activation_checkpoint\":\"selective\"");
  EXPECT_EQ(j.find("\"recompute\""), std::string::npos) << j;
  // Unknown-key messages list the new spelling.
  EXPECT_CONTAINS(config_error([] { lt::parse_config("[memory]\nrecomp = \"full\"\n", "t"); }), "recompute");
}

TEST(ConfigParse, RecomputeAndActivationCheckpointWithDifferentValuesAreAConflict) {
  auto msg = config_error(
      [] { lt::parse_config("[memory]\nactivation_checkpoint = \"full\"\nrecompute = \"selective\"\n", "t.toml"); });
  EXPECT_CONTAINS(msg, "memory.activation_checkpoint");
  EXPECT_CONTAINS(msg, "memory.recompute");
  EXPECT_CONTAINS(msg, "t.toml");
  msg = config_error(
      [] { lt::parse_config("", "t", {"memory.recompute=full", "memory.activation_checkpoint=none"}); });
  EXPECT_CONTAINS(msg, "memory.activation_checkpoint");
  EXPECT_CONTAINS(msg, "memory.recompute");
  EXPECT_CONTAINS(msg, "--set");
}

TEST(ConfigJson, ContainsEverySection) {
  auto j = lt::config_to_json(valid());
  for (const char* s : {"\"model\"", "\"data\"", "\"train\"", "\"precision\"", "\"memory\"",
                        "\"checkpoint\"", "\"comm\"", "\"log\"", "\"global_batch\":64"})
    EXPECT_CONTAINS(j, s);
}

TEST(ShippedConfigs, EveryConfigParsesAndValidates) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(LEANTRAIN_SOURCE_DIR) + "/configs")) {
    if (e.path().extension() != ".toml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(lt::validate(lt::load_config(e.path().string()), 1));
    ++n;
  }
  EXPECT_GE(n, 7);
}

}  // namespace

// docs/CONFIG.md is held to the parser's one table of keys (runtime/src/config.cpp, fields_of):
// every key config.json writes is documented under its section, every documented key parses,
// and each documented default, given with --set, leaves the resolved config unchanged.
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
  std::map<std::string, std::string> documented;  // section.key -> default as written
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("#", 0) == 0) {  // "## [train]"; any other heading ends the section
      section = line.rfind("## [", 0) != 0                  ? ""
                : line.find("], [") != std::string::npos ? "*"  // several sections: rows say which
                                                         : line.substr(4, line.find(']') - 4);
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
      documented[sec + "." + key] = keys.size() == defaults.size() ? defaults[i] : cells[2];
    }
  }
  const auto defaults = nlohmann::json::parse(lt::config_to_json(lt::Config{}));
  for (const auto& [sec, keys] : defaults.items())
    for (const auto& [key, value] : keys.items())
      EXPECT_TRUE(documented.count(sec + "." + key)) << sec << "." << key << " (default " << value.dump()
                                                      << ") is not in docs/CONFIG.md";
  for (const auto& [name, value] : documented) {
    SCOPED_TRACE(name + " = " + value);
    lt::Config c;
    try {
      c = lt::parse_config("", "docs/CONFIG.md", {name + "=" + value});
    } catch (const lt::ConfigError& e) {
      ADD_FAILURE() << "the documented key or default does not parse: " << e.what();
      continue;
    }
    EXPECT_EQ(nlohmann::json::parse(lt::config_to_json(c)), defaults) << "the documented default is not the default";
  }
}
