// The llama kind's Hugging Face mapping (models/src/foreign_weights_llama.cpp, bound to the
// registry entry) and what trainers/pretrained.h does with it: config.json read into the
// options in both RoPE spellings and checked key by key, every setting leantrain cannot
// compute named, the tensors renamed (tied heads, older saves' buffers, unexpected names),
// the export's names and config.json, model.kind picked from config.json for --init-from, a
// shard the index names missing, export shards, dtypes and --source. The numerical parity
// with transformers is tests/python/test_llama_interop.py and test_llama_train_parity.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <torch/torch.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/checkpoint_io/safetensors.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/pretrained.h"
#include "expect_error.h"

namespace {

using json = nlohmann::json;
using lt_test::error_of;

const lt::models::ModelKind& llama() { return lt::models::model_kind("llama"); }

/// A small Llama 3-style config.json, transformers 5.x spelling.
json llama_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 50},
          {"hidden_size", 16},
          {"intermediate_size", 24},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 4},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-5},
          {"tie_word_embeddings", true},
          {"rope_parameters",
           {{"rope_type", "llama3"},
            {"rope_theta", 500000.0},
            {"factor", 8.0},
            {"low_freq_factor", 1.0},
            {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8}}},
          {"bos_token_id", 1},
          {"eos_token_id", 2}};
}

lt::Options from_foreign(const json& c, const lt::Options& given = {}) {
  auto o = llama().options_from_foreign(given, c.dump(), "/models/x");
  EXPECT_TRUE(o.has_value());
  return o ? *o : lt::Options{};
}

lt::ModelSection resolved(const lt::Options& o) { return lt::models::resolve_model(lt::ModelSection{"llama", o}); }

TEST(LlamaForeign, ConfigJsonFillsTheOptions) {
  const auto o = from_foreign(llama_config());
  const auto r = resolved(o).options;
  EXPECT_EQ(r.integer("hidden_size"), 16);
  EXPECT_EQ(r.integer("num_key_value_heads"), 2);
  EXPECT_EQ(r.text("rope_scaling"), "llama3");
  EXPECT_EQ(r.number("rope_theta"), 500000.0);
  EXPECT_EQ(r.integer("rope_original_max_position_embeddings"), 8);
  EXPECT_TRUE(r.flag("tie_word_embeddings"));
  EXPECT_EQ(r.text("family"), "llama");
  EXPECT_EQ(r.integer("seq_len"), 32);  // the kind's default (128) capped at max_position_embeddings
  // transformers 4.x's spelling: rope_theta at the top, rope_scaling with "type".
  json old = llama_config();
  old.erase("rope_parameters");
  old["rope_theta"] = 500000.0;
  old["rope_scaling"] = {{"type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8}};
  EXPECT_EQ(resolved(from_foreign(old)).options, r);
  // Another kind's config.json: not this kind's business.
  const json gpt2 = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}};
  EXPECT_FALSE(llama().options_from_foreign({}, gpt2.dump(), "/models/g").has_value());
}

TEST(LlamaForeign, FamiliesAndTheirSwitches) {
  json q2 = llama_config();
  q2["architectures"] = {"Qwen2ForCausalLM"};
  q2["model_type"] = "qwen2";
  q2["use_sliding_window"] = false;
  q2["sliding_window"] = 4;  // unused without use_sliding_window
  auto r = resolved(from_foreign(q2)).options;
  EXPECT_EQ(r.text("family"), "qwen2");
  EXPECT_TRUE(r.flag("attention_bias"));
  EXPECT_FALSE(r.flag("qk_norm"));
  json q3 = llama_config();
  q3["architectures"] = {"Qwen3ForCausalLM"};
  q3["model_type"] = "qwen3";
  r = resolved(from_foreign(q3)).options;
  EXPECT_TRUE(r.flag("qk_norm"));
  EXPECT_FALSE(r.flag("attention_bias"));
  json m = llama_config();
  m["architectures"] = {"MistralForCausalLM"};
  m["model_type"] = "mistral";
  m["sliding_window"] = 16;  // shorter than max positions: seq_len capped at the window
  m.erase("head_dim");       // absent: hidden / heads
  r = resolved(from_foreign(m)).options;
  EXPECT_EQ(r.integer("seq_len"), 16);
  EXPECT_EQ(r.text("family"), "mistral");
}

TEST(LlamaForeign, SetOptionsThatAgreeStayAndEveryDisagreementIsListed) {
  lt::Options given;
  given.set("num_key_value_heads", int64_t{2});
  given.set("head_dim", int64_t{0});  // 0: hidden / heads = 4, as config.json says
  given.set("seq_len", int64_t{16});
  given.set("dropout", 0.1);
  const auto o = from_foreign(llama_config(), given);
  EXPECT_EQ(resolved(o).options.integer("seq_len"), 16);
  EXPECT_EQ(resolved(o).options.integer("head_dim"), 0);
  lt::Options bad;
  bad.set("num_hidden_layers", int64_t{3});
  bad.set("rope_theta", 10000.0);
  bad.set("tie_word_embeddings", false);
  const auto msg = error_of<lt::DataError>([&] { llama().options_from_foreign(bad, llama_config().dump(), "/m"); });
  EXPECT_CONTAINS(msg, "/m/config.json disagrees with the model (3)");
  EXPECT_CONTAINS(msg, "num_hidden_layers = 2, but model.num_hidden_layers = 3");
  EXPECT_CONTAINS(msg, "rope_parameters.rope_theta = 500000.0, but model.rope_theta = 10000.0");
  EXPECT_CONTAINS(msg, "tie_word_embeddings = true, but model.tie_word_embeddings = false");
  json m = llama_config();
  m["architectures"] = {"MistralForCausalLM"};
  m["model_type"] = "mistral";
  m["sliding_window"] = 16;
  lt::Options long_ctx;
  long_ctx.set("seq_len", int64_t{32});
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { llama().options_from_foreign(long_ctx, m.dump(), "/m"); }),
                  "sliding_window = 16 is shorter than model.seq_len = 32");
}

TEST(LlamaForeign, WhatLeantrainCannotComputeIsNamed) {
  auto refused = [](json c) {
    return error_of<lt::DataError>([&] { llama().options_from_foreign({}, c.dump(), "/m"); });
  };
  for (const char* type : {"yarn", "dynamic", "linear", "longrope"}) {
    json c = llama_config();
    c["rope_parameters"]["rope_type"] = type;
    EXPECT_CONTAINS(refused(c), std::string("rope_parameters.rope_type = \"") + type + "\"");
  }
  json c = llama_config();
  c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_CONTAINS(refused(c), "rope_scaling.rope_type = \"yarn\"");
  c = llama_config();
  c["num_attention_heads"] = 6;
  c["num_key_value_heads"] = 4;
  EXPECT_CONTAINS(refused(c), "num_attention_heads = 6 is not a multiple of num_key_value_heads = 4");
  c = llama_config();
  c["attention_bias"] = true;
  c["mlp_bias"] = true;
  c["hidden_act"] = "gelu";
  c["partial_rotary_factor"] = 0.5;
  const auto msg = refused(c);
  EXPECT_CONTAINS(msg, "LlamaForCausalLM with 4 settings leantrain cannot compute");
  EXPECT_CONTAINS(msg, "attention_bias = true");
  EXPECT_CONTAINS(msg, "mlp_bias = true");
  EXPECT_CONTAINS(msg, "hidden_act = \"gelu\"");
  EXPECT_CONTAINS(msg, "partial_rotary_factor = 0.5");
  c = llama_config();
  c.erase("hidden_size");
  EXPECT_CONTAINS(refused(c), "hidden_size: missing");
  c = llama_config();
  c["architectures"] = {"LlamaForSequenceClassification"};
  EXPECT_CONTAINS(refused(c), "not LlamaForSequenceClassification");
}

/// HF-named tensors for llama_config() (tied), each a distinct random tensor.
lt::models::NamedTensors hf_tensors(bool with_head) {
  lt::models::NamedTensors t;
  t.emplace_back("model.embed_tokens.weight", torch::randn({50, 16}));
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.emplace_back(p + "input_layernorm.weight", torch::randn({16}));
    t.emplace_back(p + "self_attn.q_proj.weight", torch::randn({16, 16}));
    t.emplace_back(p + "self_attn.k_proj.weight", torch::randn({8, 16}));
    t.emplace_back(p + "self_attn.v_proj.weight", torch::randn({8, 16}));
    t.emplace_back(p + "self_attn.o_proj.weight", torch::randn({16, 16}));
    t.emplace_back(p + "post_attention_layernorm.weight", torch::randn({16}));
    t.emplace_back(p + "mlp.gate_proj.weight", torch::randn({24, 16}));
    t.emplace_back(p + "mlp.up_proj.weight", torch::randn({24, 16}));
    t.emplace_back(p + "mlp.down_proj.weight", torch::randn({16, 24}));
    t.emplace_back(p + "self_attn.rotary_emb.inv_freq", torch::randn({2}));
  }
  t.emplace_back("model.norm.weight", torch::randn({16}));
  if (with_head) t.emplace_back("lm_head.weight", torch::randn({50, 16}));
  return t;
}

TEST(LlamaForeign, ImportRenamesTiesAndIgnores) {
  torch::manual_seed(1);
  const auto o = resolved(from_foreign(llama_config())).options;
  lt::models::ForeignWeights w;
  w.tensors = hf_tensors(true);
  w.config_json = llama_config().dump();
  w.source = "/m";
  const auto im = llama().import_weights(o, w);
  EXPECT_EQ(im.format, "LlamaForCausalLM");
  EXPECT_EQ(im.tensors.size(), 20u);  // embed, 2 x 9, norm; no lm_head (tied), no inv_freq
  std::map<std::string, torch::Tensor> got(im.tensors.begin(), im.tensors.end());
  EXPECT_TRUE(torch::equal(got.at("blocks.1.self_attn.k_proj.weight"), w.tensors[13].second));
  EXPECT_TRUE(got.count("embed_tokens.weight") && got.count("norm.weight") && !got.count("lm_head.weight"));
  std::string notes;
  for (const auto& n : im.notes) notes += n + "\n";
  EXPECT_CONTAINS(notes, "lm_head.weight differs from model.embed_tokens.weight");  // as transformers: ignored
  EXPECT_CONTAINS(notes, "model.layers.0.self_attn.rotary_emb.inv_freq");
  // Untied: the head is read; a name of no Llama weight is refused by name.
  auto untied = llama_config();
  untied["tie_word_embeddings"] = false;
  const auto ou = resolved(from_foreign(untied)).options;
  w.config_json = untied.dump();
  EXPECT_EQ(llama().import_weights(ou, w).tensors.size(), 21u);
  w.tensors.emplace_back("model.layers.0.self_attn.o_proj.bias", torch::zeros({16}));
  w.tensors.emplace_back("embed_tokens.weight", torch::zeros({50, 16}));  // the prefixed one again
  const auto msg = error_of<lt::DataError>([&] { llama().import_weights(ou, w); });
  EXPECT_CONTAINS(msg, "unexpected model.layers.0.self_attn.o_proj.bias [16]");
  EXPECT_CONTAINS(msg, "embed_tokens.weight: given twice");
  // Another architecture, with model.kind = llama: named, the four listed.
  w.config_json = json{{"architectures", {"GemmaForCausalLM"}}, {"model_type", "gemma"}}.dump();
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { llama().import_weights(ou, w); }),
                  "architectures [\"GemmaForCausalLM\"]: not an architecture leantrain reads as model.kind = llama; it "
                  "reads LlamaForCausalLM (llama), Qwen2ForCausalLM (qwen2), Qwen3ForCausalLM (qwen3), "
                  "MistralForCausalLM (mistral)");
}

TEST(LlamaForeign, ExportNamesAndConfig) {
  torch::manual_seed(2);
  json q3 = llama_config();
  q3["architectures"] = {"Qwen3ForCausalLM"};
  q3["model_type"] = "qwen3";
  q3["tie_word_embeddings"] = false;
  const auto section = resolved(from_foreign(q3));
  auto model = lt::models::build_model(section);
  lt::models::NamedTensors ts;
  for (auto& nt : lt::trainers::model_tensors(*model)) ts.emplace_back(nt.name, nt.tensor);
  const auto e = llama().export_weights(section.options, ts);
  EXPECT_EQ(e.format, "Hugging Face Qwen3ForCausalLM");
  EXPECT_EQ(e.tensors.size(), ts.size());
  std::set<std::string> names;
  for (const auto& [n, t] : e.tensors) names.insert(n);
  for (const char* n : {"model.embed_tokens.weight", "model.layers.1.self_attn.q_norm.weight", "model.norm.weight",
                        "lm_head.weight"})
    EXPECT_TRUE(names.count(n)) << n;
  const json c = json::parse(e.config_json);
  EXPECT_EQ(c["architectures"], json({"Qwen3ForCausalLM"}));
  EXPECT_EQ(c["model_type"], "qwen3");
  EXPECT_EQ(c["head_dim"], 4);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["rope_parameters"]["rope_type"], "llama3");
  EXPECT_EQ(c["rope_parameters"]["original_max_position_embeddings"], 8);
  EXPECT_EQ(c["rope_scaling"]["factor"], 8.0);
  EXPECT_EQ(c["use_sliding_window"], false);
  EXPECT_TRUE(c["bos_token_id"].is_null());
  // What an export reads back is what it wrote.
  lt::Options again = llama().options_from_foreign({}, e.config_json, "/x").value();
  EXPECT_EQ(resolved(again).options.text("family"), "qwen3");
  // Switches of another family have no counterpart.
  auto mixed = section.options;
  mixed.set("family", std::string("llama"));
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { llama().export_weights(mixed, ts); }),
                  "model.qk_norm = true is Qwen3's: set model.family = \"qwen3\"");
}

TEST(LlamaForeign, ShardPlanAsHuggingFace) {
  std::vector<lt::checkpoint_io::NamedTensor> ts;
  for (int64_t n : {10, 10, 10, 50, 5}) ts.push_back({"t" + std::to_string(n), torch::zeros({n})});  // 4 bytes each
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(lt::trainers::shard_plan(ts, 0), (Plan{{0, 1, 2, 3, 4}}));
  EXPECT_EQ(lt::trainers::shard_plan(ts, 80), (Plan{{0, 1}, {2}, {3}, {4}}));  // the 200-byte one alone
  EXPECT_EQ(lt::trainers::shard_plan(ts, 1000), (Plan{{0, 1, 2, 3, 4}}));
}

class LlamaDirs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/lt_llama_fw_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
           std::to_string(::getpid());
    lt::files::remove_tree(dir_);
    lt::files::make_dirs(dir_);
  }
  void TearDown() override { lt::files::remove_tree(dir_); }
  std::string path(const std::string& n) const { return lt::files::join(dir_, n); }

  std::string hf_dir(const std::string& name, const json& config, const lt::models::NamedTensors& ts) {
    const std::string d = path(name);
    lt::files::make_dirs(d);
    lt::files::write_atomic(lt::files::join(d, "config.json"), config.dump());
    std::vector<lt::checkpoint_io::NamedTensor> v;
    for (const auto& [n, t] : ts) v.push_back({n, t});
    lt::checkpoint_io::write_safetensors(lt::files::join(d, "model.safetensors"), v, {{"format", "pt"}});
    return d;
  }

  /// The model of `section` as a step-0 checkpoint (as leantrain_dump_outputs --save-checkpoint).
  std::string checkpoint(const std::string& name, const lt::ModelSection& section, torch::nn::Module& model) {
    lt::Config cfg;
    cfg.model = section;
    const auto j = json::parse(lt::config_to_json(cfg));
    lt::checkpoint_io::Checkpoint c;
    c.config = j.dump();
    c.model_config = j.at("model").dump();
    c.train_config = j.at("train").dump();
    for (auto& nt : lt::trainers::model_tensors(model)) c.model.push_back({nt.name, nt.tensor.detach().contiguous()});
    const std::string p = path(name);
    lt::checkpoint_io::write_checkpoint(p, c);
    return p;
  }

  std::string dir_;
};

TEST_F(LlamaDirs, InitFromPicksTheKindAndFillsTheOptions) {
  torch::manual_seed(3);
  const std::string d = hf_dir("hf", llama_config(), hf_tensors(false));
  std::vector<std::string> notes;
  const auto s = lt::trainers::model_section_for_init(lt::ModelSection{}, d, &notes);
  EXPECT_EQ(s.kind, "llama");
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_CONTAINS(notes[0], "model.kind = \"llama\" from " + d + "/config.json");
  EXPECT_CONTAINS(notes[1], "hidden_size = 16");
  auto model = lt::models::build_model(s);
  const auto r = lt::trainers::init_model(d, lt::models::resolve_model(s), *model, false);
  EXPECT_EQ(r.loaded, 20);
  EXPECT_EQ(r.description, "Hugging Face LlamaForCausalLM");
  // model.kind = gpt on a Llama directory: which kind to set.
  lt::ModelSection gpt;
  gpt.kind = "gpt";
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::trainers::model_section_for_init(gpt, d); }),
                  "set model.kind = \"llama\" (--set model.kind=llama)");
  // No kind reads it, and none is set.
  const std::string mamba = hf_dir("mamba", {{"architectures", {"MambaForCausalLM"}}, {"model_type", "mamba"}}, {});
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::trainers::model_section_for_init(lt::ModelSection{}, mamba); }),
                  "architectures [\"MambaForCausalLM\"]) and model.kind is not set");
  // A checkpoint or a safetensors file: the section as given.
  lt::ModelSection given;
  given.kind = "llama";
  EXPECT_EQ(lt::trainers::model_section_for_init(given, lt::files::join(d, "model.safetensors")).options.values().size(), 0u);
}

TEST_F(LlamaDirs, AShardTheIndexNamesMissingIsNamed) {
  torch::manual_seed(4);
  const std::string d = hf_dir("hf", llama_config(), {});
  ::unlink(lt::files::join(d, "model.safetensors").c_str());
  lt::files::write_atomic(lt::files::join(d, "model.safetensors.index.json"),
                          json{{"weight_map", {{"model.norm.weight", "model-00002-of-00002.safetensors"}}}}.dump());
  const auto s = lt::trainers::model_section_for_init(lt::ModelSection{"llama", {}}, d);
  auto model = lt::models::build_model(s);
  const auto msg = error_of<lt::DataError>([&] { lt::trainers::init_model(d, lt::models::resolve_model(s), *model, false); });
  EXPECT_CONTAINS(msg, d + "/model.safetensors.index.json: weight_map puts 1 tensor (e.g. 'model.norm.weight') in "
                           "model-00002-of-00002.safetensors, but " + d + "/model-00002-of-00002.safetensors does not exist");
}

TEST_F(LlamaDirs, ExportShardsCastsAndKeepsTheSource) {
  torch::manual_seed(5);
  auto src_cfg = llama_config();
  src_cfg["torch_dtype"] = "bfloat16";
  const std::string src = hf_dir("src", src_cfg, hf_tensors(false));
  lt::files::write_atomic(lt::files::join(src, "tokenizer.json"), "{}");
  const auto section = lt::trainers::model_section_for_init(lt::ModelSection{"llama", {}}, src);
  auto model = lt::models::build_model(section);
  lt::trainers::init_model(src, lt::models::resolve_model(section), *model, false);
  const std::string ckpt = checkpoint("m.h5", lt::models::resolve_model(section), *model);

  lt::trainers::ExportOptions opt;
  opt.dtype = "bf16";
  opt.max_shard_bytes = 2000;
  opt.source = src;
  std::vector<std::string> notes;
  const auto written = lt::trainers::export_weights(ckpt, "hf", path("out"), &notes, opt);
  const auto index = json::parse(std::ifstream(path("out/model.safetensors.index.json")));
  std::set<std::string> shards;
  for (const auto& [n, f] : index["weight_map"].items()) shards.insert(f.get<std::string>());
  EXPECT_GT(shards.size(), 2u);
  EXPECT_EQ(index["weight_map"].size(), 20u);
  for (const auto& f : shards) {
    const auto st = lt::checkpoint_io::read_safetensors(path("out/" + f));
    for (const auto& nt : st.tensors) EXPECT_EQ(nt.tensor.scalar_type(), torch::kBFloat16) << nt.name;
  }
  const auto c = json::parse(std::ifstream(path("out/config.json")));
  EXPECT_EQ(c["dtype"], "bfloat16");
  EXPECT_FALSE(c.contains("torch_dtype"));  // the source's, describing its own files
  EXPECT_EQ(c["bos_token_id"], 1);
  EXPECT_EQ(c["eos_token_id"], 2);
  EXPECT_TRUE(lt::files::exists(path("out/tokenizer.json")));
  EXPECT_EQ(written.back(), path("out/tokenizer.json"));
  // Read back by --init-from: the same weights, rounded to bf16.
  auto again = lt::models::build_model(section);
  lt::trainers::init_model(path("out"), lt::models::resolve_model(section), *again, false);
  auto a = lt::trainers::model_tensors(*model), b = lt::trainers::model_tensors(*again);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i].tensor.to(torch::kBFloat16).to(torch::kFloat), b[i].tensor)) << a[i].name;
  // Bad options.
  opt.dtype = "int8";
  EXPECT_CONTAINS(error_of<lt::ConfigError>([&] { lt::trainers::export_weights(ckpt, "hf", path("o2"), nullptr, opt); }),
                  "--dtype int8: must be fp32, bf16 or fp16");
  opt.dtype = "fp32";
  opt.source = path("nowhere");
  EXPECT_CONTAINS(error_of<lt::DataError>([&] { lt::trainers::export_weights(ckpt, "hf", path("o2"), nullptr, opt); }),
                  "nowhere: not a directory");
}

}  // namespace
