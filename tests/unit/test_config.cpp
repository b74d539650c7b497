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
#include "expect_error.h"

namespace {

using lt_test::config_error;

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
  // [model] keys besides kind are kept as given, for the kind's table (test_registry.cpp).
  EXPECT_EQ(c.model.kind, "gpt");
  EXPECT_EQ(c.model.options.integer("n_layer"), 4);
  EXPECT_EQ(c.model.options.integers("hidden"), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(c.model.options.values().size(), 2u);
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
  EXPECT_EQ(c.model.options.integers("hidden"), (std::vector<int64_t>{3}));
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
  c.data.limit = -1;
  EXPECT_CONTAINS(config_error([&] { lt::validate(c, 1); }), "data.limit = -1");
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
  c = valid();
  c.precision.head_matmul = "bf16";
  msg = config_error([&] { lt::validate(c, 1); });
  EXPECT_CONTAINS(msg, "precision.head_matmul = 'bf16'");
  EXPECT_CONTAINS(msg, "auto | autocast | fp32");
  c = valid();
  c.precision.conv_products = "bf16";
  msg = config_error([&] { lt::validate(c, 1); });
  EXPECT_CONTAINS(msg, "precision.conv_products = 'bf16'");
  EXPECT_CONTAINS(msg, "auto | autocast | fp32");
}

// Keys owned by another component are checked there, once (config.h: validate): runtime
// leaves their values alone (tests/unit/test_models.cpp, test_data.cpp check them).
TEST(ConfigValidate, KeysOfOtherComponentsAreLeftToThem) {
  auto c = valid();
  c.model.kind = "no-such-kind";               // the model registry
  c.model.options.set("d_model", int64_t{100});
  c.model.options.set("n_head", int64_t{3});  // the kind's table and check
  c.memory.recompute = "every:0";              // models::RecomputePolicy::parse
  c.data.options.set("eval_fraction", 7.0);    // the data kind's table
  c.data.options.set("mask_prob", std::string("x"));
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

// memory.activation_checkpoint is the deprecated spelling of memory.recompute: either fills
// the one field; --set overrides the file whatever the spelling; config.json writes the field
// once, as recompute; the unknown-key messages offer only recompute.
TEST(ConfigParse, ActivationCheckpointIsADeprecatedAliasOfRecompute) {
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"selective\"\n", "t").memory.recompute, "selective");
  EXPECT_EQ(lt::parse_config("[memory]\nactivation_checkpoint = \"full\"\n", "t").memory.recompute, "full");
  EXPECT_EQ(lt::parse_config("", "t", {"memory.recompute=every:2"}).memory.recompute, "every:2");
  EXPECT_EQ(lt::parse_config("", "t", {"memory.activation_checkpoint=every:3"}).memory.recompute, "every:3");
  // The same value under both spellings is no conflict.
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"full\"\nactivation_checkpoint = \"full\"\n", "t")
                .memory.recompute,
            "full");
  // --set overrides the file, in either spelling.
  EXPECT_EQ(lt::parse_config("[memory]\nrecompute = \"selective\"\n", "t", {"memory.activation_checkpoint=full"})
                .memory.recompute,
            "full");
  EXPECT_EQ(lt::parse_config("[memory]\nactivation_checkpoint = \"selective\"\n", "t", {"memory.recompute=none"})
                .memory.recompute,
            "none");
  const auto j = nlohmann::json::parse(
      lt::config_to_json(lt::parse_config("[memory]\nactivation_checkpoint = \"selective\"\n", "t")));
  EXPECT_EQ(j["memory"]["recompute"], "selective") << j.dump();
  EXPECT_FALSE(j["memory"].contains("activation_checkpoint")) << j.dump();
  EXPECT_FALSE(j.contains("warnings")) << j.dump();
  const auto unknown = config_error([] { lt::parse_config("[memory]\nrecomp = \"full\"\n", "t"); });
  EXPECT_CONTAINS(unknown, "recompute");
  EXPECT_EQ(unknown.find("activation_checkpoint"), std::string::npos) << unknown;
}

// The deprecated spelling adds one line to Config::warnings per source that uses it (the
// file, by its name, or --set), naming both spellings; the new one adds none.
TEST(ConfigParse, ActivationCheckpointAddsADeprecationWarning) {
  EXPECT_TRUE(lt::parse_config("[memory]\nrecompute = \"full\"\n", "t.toml", {"memory.recompute=none"})
                  .warnings.empty());
  auto c = lt::parse_config("[memory]\nactivation_checkpoint = \"full\"\n", "t.toml");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_EQ(c.warnings[0], "t.toml: memory.activation_checkpoint is deprecated; write memory.recompute (same values)");
  c = lt::parse_config("[memory]\nactivation_checkpoint = \"full\"\n", "t.toml",
                       {"memory.activation_checkpoint=none", "memory.activation_checkpoint=selective"});
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_EQ(c.warnings[0].rfind("t.toml: memory.activation_checkpoint is deprecated", 0), 0u) << c.warnings[0];
  EXPECT_EQ(c.warnings[1], "--set: memory.activation_checkpoint is deprecated; write memory.recompute (same values)");
  EXPECT_EQ(c.memory.recompute, "selective");
}

// Both spellings with different values in one source (the file, or the --set list) are
// refused, naming both keys and the source.
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

}  // namespace

