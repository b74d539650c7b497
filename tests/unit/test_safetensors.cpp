// safetensors files and pretrained weights in and out (checkpoint_io/safetensors.h,
// trainers/pretrained.h, models/foreign_weights.h): the round trip of every dtype, each lie a
// file can tell (offsets past the data, reversed, overlapping, of the wrong size; a header
// over the cap; truncation; an unknown dtype; not JSON), a Hugging Face directory of another
// architecture, config.json disagreements, name and shape mismatches listed with nothing
// copied, and `export` failures that write nothing. Each error names the file (and the
// tensor). The numerical interop with transformers and torchvision is
// tests/python/test_interop.py.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include <torch/torch.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/checkpoint_io/safetensors.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/pretrained.h"
#include "expect_error.h"

namespace {

using lt_test::error_of;

using namespace lt::checkpoint_io;
using json = nlohmann::json;


class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = "/tmp/lt_st_" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()) + "_" +
           std::to_string(::getpid());
    lt::files::remove_tree(dir_);
    lt::files::make_dirs(dir_);
  }
  void TearDown() override { lt::files::remove_tree(dir_); }
  std::string path(const std::string& name) const { return lt::files::join(dir_, name); }

  /// A file with this header (as given) and `data_bytes` zero bytes after it.
  std::string raw(const std::string& name, const std::string& header, size_t data_bytes, int64_t claimed_len = -1) {
    const std::string p = path(name);
    std::ofstream f(p, std::ios::binary);
    uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) f.put(static_cast<char>(n & 0xff));
    f << header << std::string(data_bytes, '\0');
    return p;
  }

  /// Files in dir_ whose names contain `part`.
  int count_files(const std::string& part) const {
    int n = 0;
    for (const auto& f : lt::files::list_dir(dir_)) n += f.find(part) != std::string::npos;
    return n;
  }

  std::string dir_;
};

TEST_F(Safetensors, RoundTripsEveryDtypeAndTheMetadata) {
  torch::manual_seed(0);
  std::vector<NamedTensor> ts = {
      {"f32", torch::randn({3, 5})},
      {"f16", torch::randn({4}).to(torch::kHalf)},
      {"bf16", torch::randn({2, 2}).to(torch::kBFloat16)},
      {"f64", torch::randn({7}, torch::kDouble)},
      {"i64", torch::arange(6, torch::kLong).reshape({2, 3})},
      {"i32", torch::arange(5, torch::kInt)},
      {"i8", torch::tensor({-3, 4}, torch::kChar)},
      {"u8", torch::tensor({250, 1}, torch::kByte)},
      {"bool", torch::tensor({true, false, true})},
      {"scalar", torch::full({}, 42, torch::kLong)},
      {"empty", torch::zeros({0, 3})},
      {"strided", torch::randn({4, 6}).t()}};  // written contiguous
  write_safetensors(path("a.safetensors"), ts, {{"format", "pt"}, {"note", "x"}});
  EXPECT_EQ(count_files(".tmp."), 0);
  auto back = read_safetensors(path("a.safetensors"));
  EXPECT_EQ(back.metadata.at("format"), "pt");
  EXPECT_EQ(back.metadata.at("note"), "x");
  ASSERT_EQ(back.tensors.size(), ts.size());
  std::map<std::string, torch::Tensor> got;
  for (auto& nt : back.tensors) got[nt.name] = nt.tensor;
  for (const auto& nt : ts) {
    ASSERT_TRUE(got.count(nt.name)) << nt.name;
    EXPECT_EQ(got[nt.name].scalar_type(), nt.tensor.scalar_type()) << nt.name;
    EXPECT_EQ(got[nt.name].sizes(), nt.tensor.sizes()) << nt.name;
    EXPECT_TRUE(torch::equal(got[nt.name], nt.tensor)) << nt.name;
  }
  // The header is padded to 8 bytes (the reference implementation's alignment).
  std::ifstream f(path("a.safetensors"), std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  EXPECT_EQ(len[0] % 8, 0);
}

TEST_F(Safetensors, OffsetsPastTheDataAreRefusedNamingFileAndTensor) {
  const auto p = raw("past.safetensors", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8);
  const auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "reach past the data (8 bytes");
}

TEST_F(Safetensors, ReversedOffsetsAreRefused) {
  const auto p = raw("rev.safetensors", R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", 16);
  const auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "ends before it begins");
}

TEST_F(Safetensors, ASizeThatIsNotNumelTimesTheDtypeIsRefused) {
  const auto p = raw("size.safetensors", R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", 24);
  const auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "tensor 'w'");
  EXPECT_CONTAINS(msg, "hold 20 bytes, but F32 [2,3] needs 24");
}

TEST_F(Safetensors, OverlappingTensorsAreRefused) {
  const auto p = raw("overlap.safetensors",
                     R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                     R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                     16);
  const auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "'a' [0, 16) and 'b' [8, 16) overlap");
}

TEST_F(Safetensors, AHeaderOverTheCapIsRefusedBeforeReadingIt) {
  const auto p = raw("cap.safetensors", "{}", 0, static_cast<int64_t>(kSafetensorsMaxHeader) + 1);
  const auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "over the cap of 100000000 bytes");
}

TEST_F(Safetensors, TruncatedFilesAreRefused) {
  write_safetensors(path("good.safetensors"), {{"a", torch::ones({8})}, {"b", torch::ones({8})}});
  const auto size = lt::files::file_size(path("good.safetensors"));
  ASSERT_EQ(::truncate(path("good.safetensors").c_str(), size - 4), 0);
  auto msg = error_of<lt::DataError>([&] { read_safetensors(path("good.safetensors")); });
  EXPECT_CONTAINS(msg, "tensor 'b'");
  EXPECT_CONTAINS(msg, "truncated or lying header");
  ASSERT_EQ(::truncate(path("good.safetensors").c_str(), 20), 0);  // inside the header
  msg = error_of<lt::DataError>([&] { read_safetensors(path("good.safetensors")); });
  EXPECT_CONTAINS(msg, "truncated safetensors file: the header says");
  ASSERT_EQ(::truncate(path("good.safetensors").c_str(), 5), 0);  // inside the length
  msg = error_of<lt::DataError>([&] { read_safetensors(path("good.safetensors")); });
  EXPECT_CONTAINS(msg, "no 8-byte header length");
}

TEST_F(Safetensors, AnUnknownDtypeOrABrokenHeaderIsRefused) {
  auto p = raw("dtype.safetensors", R"({"w":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", 1);
  auto msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "tensor 'w': unsupported dtype \"F7\"");
  p = raw("json.safetensors", R"({"w":{"dtype":"F32",)", 0);
  msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "not valid JSON");
  p = raw("shape.safetensors", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4);
  msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "not a non-negative integer");
  p = raw("noff.safetensors", R"({"w":{"dtype":"F32","shape":[1]}})", 4);
  msg = error_of<lt::DataError>([&] { read_safetensors(p); });
  EXPECT_CONTAINS(msg, "no \"data_offsets\"");
}

TEST_F(Safetensors, AFailedWriteLeavesNothing) {
  const std::string p = path("missing_dir/x.safetensors");
  const auto msg = error_of<lt::StorageError>([&] { write_safetensors(p, {{"a", torch::ones({2})}}); });
  EXPECT_CONTAINS(msg, p);
  EXPECT_CONTAINS(msg, "nothing written");
  EXPECT_FALSE(lt::files::exists(path("missing_dir")));
  EXPECT_EQ(count_files(".tmp."), 0);
  // A dtype safetensors has no name for: refused before anything is written.
  error_of<lt::DataError>([&] { write_safetensors(path("c.safetensors"), {{"c", torch::ones({2}, torch::kComplexFloat)}}); });
  EXPECT_FALSE(lt::files::exists(path("c.safetensors")));
}

// ---- pretrained weights (trainers/pretrained.h) ----

lt::ModelSection gpt_section(int64_t layers = 1) {
  lt::models::ModelConfig c;
  c.kind = "gpt";
  c.vocab_size = 50;
  c.seq_len = 8;
  c.n_layer = layers;
  c.n_head = 2;
  c.d_model = 16;
  return lt::models::resolve_model(lt::models::builtin_model_section(c));
}

/// A Hugging Face GPT-2 directory for gpt_section(): config.json and model.safetensors.
std::vector<NamedTensor> gpt2_tensors(int64_t layers = 1, int64_t positions = 8) {
  const int64_t d = 16;
  std::vector<NamedTensor> t = {{"transformer.wte.weight", torch::randn({50, d})},
                                {"transformer.wpe.weight", torch::randn({positions, d})},
                                {"transformer.ln_f.weight", torch::randn({d})},
                                {"transformer.ln_f.bias", torch::randn({d})}};
  for (int64_t i = 0; i < layers; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    t.push_back({h + "ln_1.weight", torch::randn({d})});
    t.push_back({h + "ln_1.bias", torch::randn({d})});
    t.push_back({h + "attn.c_attn.weight", torch::randn({d, 3 * d})});
    t.push_back({h + "attn.c_attn.bias", torch::randn({3 * d})});
    t.push_back({h + "attn.c_proj.weight", torch::randn({d, d})});
    t.push_back({h + "attn.c_proj.bias", torch::randn({d})});
    t.push_back({h + "attn.bias", torch::ones({1, 1, positions, positions})});  // old causal-mask buffer
    t.push_back({h + "ln_2.weight", torch::randn({d})});
    t.push_back({h + "ln_2.bias", torch::randn({d})});
    t.push_back({h + "mlp.c_fc.weight", torch::randn({d, 4 * d})});
    t.push_back({h + "mlp.c_fc.bias", torch::randn({4 * d})});
    t.push_back({h + "mlp.c_proj.weight", torch::randn({4 * d, d})});
    t.push_back({h + "mlp.c_proj.bias", torch::randn({d})});
  }
  return t;
}

json gpt2_config() {
  return {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"n_layer", 1},  {"n_head", 2},
          {"n_embd", 16},                        {"vocab_size", 50},     {"n_positions", 8}, {"n_inner", nullptr},
          {"activation_function", "gelu_new"},   {"layer_norm_epsilon", 1e-5}};
}

void write_dir(const std::string& dir, const json& config, const std::vector<NamedTensor>& tensors) {
  lt::files::make_dirs(dir);
  lt::files::write_atomic(lt::files::join(dir, "config.json"), config.dump());
  write_safetensors(lt::files::join(dir, "model.safetensors"), tensors, {{"format", "pt"}});
}

/// The model's tensors, cloned (to show nothing was copied into it).
std::vector<torch::Tensor> snapshot(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  for (auto& nt : lt::trainers::model_tensors(m)) out.push_back(nt.tensor.detach().clone());
  return out;
}

bool unchanged(torch::nn::Module& m, const std::vector<torch::Tensor>& before) {
  auto now = lt::trainers::model_tensors(m);
  for (size_t i = 0; i < now.size(); ++i)
    if (!torch::equal(now[i].tensor, before[i])) return false;
  return true;
}

TEST_F(Safetensors, AHuggingFaceGpt2DirectoryLoadsWithTransposedConv1D) {
  torch::manual_seed(1);
  const auto tensors = gpt2_tensors();
  write_dir(path("hf"), gpt2_config(), tensors);
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  const auto r = lt::trainers::init_model(path("hf"), section, *model, false);
  EXPECT_EQ(r.loaded, static_cast<int64_t>(lt::trainers::model_tensors(*model).size()));
  EXPECT_EQ(r.description, "Hugging Face GPT2LMHeadModel");
  std::map<std::string, torch::Tensor> params;
  for (auto& nt : lt::trainers::model_tensors(*model)) params[nt.name] = nt.tensor;
  for (const auto& nt : tensors)
    if (nt.name == "transformer.h.0.attn.c_attn.weight") EXPECT_TRUE(torch::equal(params["blocks.0.attn.qkv.weight"], nt.tensor.t()));
    else if (nt.name == "transformer.wte.weight") EXPECT_TRUE(torch::equal(params["wte.weight"], nt.tensor));
  ASSERT_FALSE(r.notes.empty());
  EXPECT_CONTAINS(r.notes.back(), "transformer.h.0.attn.bias");  // the mask buffer, ignored
}

TEST_F(Safetensors, HalfPrecisionFilesLoadIntoTheFp32Model) {
  torch::manual_seed(4);
  auto tensors = gpt2_tensors();
  for (auto& nt : tensors) nt.tensor = nt.tensor.to(torch::kBFloat16);
  write_dir(path("hf"), gpt2_config(), tensors);
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  lt::trainers::init_model(path("hf"), section, *model, false);
  for (auto& nt : lt::trainers::model_tensors(*model)) {
    EXPECT_EQ(nt.tensor.scalar_type(), torch::kFloat);
    if (nt.name == "wte.weight") EXPECT_TRUE(torch::equal(nt.tensor, tensors[0].tensor.to(torch::kFloat)));
  }
}

TEST_F(Safetensors, AHuggingFaceDirectoryOfAnotherArchitectureIsRefused) {
  write_dir(path("bert"), {{"architectures", {"BertForMaskedLM"}}, {"model_type", "bert"}}, {{"x", torch::ones({1})}});
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  const auto before = snapshot(*model);
  auto msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("bert"), section, *model, false); });
  EXPECT_CONTAINS(msg, path("bert") + "/config.json");
  EXPECT_CONTAINS(msg, "another architecture (model_type \"bert\", architectures [\"BertForMaskedLM\"])");
  EXPECT_CONTAINS(msg, "model.kind = gpt reads GPT2LMHeadModel");
  EXPECT_TRUE(unchanged(*model, before));
  // A Hugging Face directory for resnet (torchvision's weights are read as safetensors files).
  lt::models::ModelConfig rc;
  rc.kind = "resnet";
  rc.depth = 18;
  auto rsec = lt::models::resolve_model(lt::models::builtin_model_section(rc));
  auto rmodel = lt::models::build_model(rsec);
  msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("bert"), rsec, *rmodel, false); });
  EXPECT_CONTAINS(msg, "tools/torchvision_to_safetensors.py");
  // A directory without config.json.
  lt::files::make_dirs(path("empty"));
  msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("empty"), section, *model, false); });
  EXPECT_CONTAINS(msg, "without config.json");
}

TEST_F(Safetensors, ConfigDisagreementsAreEachNamed) {
  auto config = gpt2_config();
  config["n_embd"] = 32;
  config["n_positions"] = 4;
  config["activation_function"] = "relu";
  write_dir(path("hf"), config, gpt2_tensors());
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  const auto msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("hf"), section, *model, false); });
  EXPECT_CONTAINS(msg, "disagrees with the model (3)");
  EXPECT_CONTAINS(msg, "n_embd = 32, but model.d_model = 16");
  EXPECT_CONTAINS(msg, "n_positions = 4 is shorter than model.seq_len = 8");
  EXPECT_CONTAINS(msg, "activation_function = \"relu\"");
}

TEST_F(Safetensors, NameAndShapeMismatchesAreAllListedAndNothingIsCopied) {
  torch::manual_seed(2);
  auto tensors = gpt2_tensors();
  for (auto& nt : tensors)
    if (nt.name == "transformer.h.0.mlp.c_fc.weight") nt.tensor = torch::randn({16, 32});  // another d_ff
  tensors.erase(std::remove_if(tensors.begin(), tensors.end(),
                               [](const NamedTensor& nt) { return nt.name == "transformer.ln_f.bias"; }),
                tensors.end());
  auto config = gpt2_config();
  config.erase("n_inner");
  write_dir(path("hf"), config, tensors);
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  const auto before = snapshot(*model);
  auto msg = error_of<CheckpointError>([&] { lt::trainers::init_model(path("hf"), section, *model, false); });
  EXPECT_CONTAINS(msg, path("hf"));
  EXPECT_CONTAINS(msg, "(2 problems)");
  EXPECT_CONTAINS(msg, "blocks.0.mlp.fc.weight: shape [32, 16] in the checkpoint, [64, 16] in the model");
  EXPECT_CONTAINS(msg, "missing ln_f.bias [16]");
  EXPECT_TRUE(unchanged(*model, before));

  // A name no GPT2LMHeadModel has: listed by its own name.
  tensors = gpt2_tensors();
  tensors.push_back({"transformer.h.0.attn.rotary.weight", torch::ones({3})});
  tensors.push_back({"score.weight", torch::ones({2, 16})});
  write_dir(path("hf2"), gpt2_config(), tensors);
  msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("hf2"), section, *model, false); });
  EXPECT_CONTAINS(msg, "2 tensors of the GPT2LMHeadModel weights cannot be placed");
  EXPECT_CONTAINS(msg, "unexpected transformer.h.0.attn.rotary.weight [3]");
  EXPECT_CONTAINS(msg, "unexpected score.weight [2, 16]");
  EXPECT_TRUE(unchanged(*model, before));
}

TEST_F(Safetensors, AnUntiedHeadIsRefusedAndLongerPositionsAreCropped) {
  torch::manual_seed(3);
  auto tensors = gpt2_tensors(1, 20);
  tensors.push_back({"lm_head.weight", torch::randn({50, 16})});
  auto config = gpt2_config();
  config["n_positions"] = 20;
  write_dir(path("hf"), config, tensors);
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  auto msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("hf"), section, *model, false); });
  EXPECT_CONTAINS(msg, "lm_head.weight differs from wte.weight");
  tensors.back().tensor = tensors[0].tensor.clone();  // tied: equal to wte
  write_dir(path("hf"), config, tensors);
  const auto r = lt::trainers::init_model(path("hf"), section, *model, false);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_CONTAINS(r.notes[0], "took the first 8 of 20 position rows");
  for (auto& nt : lt::trainers::model_tensors(*model))
    if (nt.name == "wpe.weight") EXPECT_TRUE(torch::equal(nt.tensor, tensors[1].tensor.narrow(0, 0, 8)));
}

TEST_F(Safetensors, AShardIndexPointingOutsideTheDirectoryIsRefused) {
  lt::files::make_dirs(path("hf"));
  lt::files::write_atomic(path("hf/config.json"), gpt2_config().dump());
  lt::files::write_atomic(path("hf/model.safetensors.index.json"),
                          R"({"weight_map":{"transformer.wte.weight":"../evil.safetensors"}})");
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  const auto msg = error_of<lt::DataError>([&] { lt::trainers::init_model(path("hf"), section, *model, false); });
  EXPECT_CONTAINS(msg, "model.safetensors.index.json");
  EXPECT_CONTAINS(msg, "is not a file name in");
}

TEST_F(Safetensors, ExportFailuresWriteNothing) {
  auto section = gpt_section();
  auto model = lt::models::build_model(section);
  Checkpoint c;
  lt::Config cfg;
  cfg.model = section;
  c.model_config = json::parse(lt::config_to_json(cfg)).at("model").dump();
  for (auto& nt : lt::trainers::model_tensors(*model)) c.model.push_back({nt.name, nt.tensor.detach().clone()});
  write_checkpoint(path("ok.h5"), c);

  // A bad checkpoint: nothing at --out.
  lt::files::write_atomic(path("bad.h5"), "not a checkpoint");
  auto msg = error_of<CheckpointError>([&] { lt::trainers::export_weights(path("bad.h5"), "hf", path("out1")); });
  EXPECT_CONTAINS(msg, path("bad.h5"));
  EXPECT_FALSE(lt::files::exists(path("out1")));
  // An --out under a file: nothing written.
  lt::files::write_atomic(path("a_file"), "x");
  msg = error_of<lt::StorageError>([&] { lt::trainers::export_weights(path("ok.h5"), "hf", path("a_file/out")); });
  EXPECT_CONTAINS(msg, path("a_file/out"));
  EXPECT_CONTAINS(msg, "nothing written");
  // An unknown format.
  msg = error_of<lt::ConfigError>([&] { lt::trainers::export_weights(path("ok.h5"), "onnx", path("out2")); });
  EXPECT_CONTAINS(msg, "--format onnx");
  EXPECT_FALSE(lt::files::exists(path("out2")));
  // A kind without another library's counterpart: hf refused, safetensors written.
  lt::models::ModelConfig mc;  // mlp
  auto mlp_section = lt::models::resolve_model(lt::models::builtin_model_section(mc));
  auto mlp = lt::models::build_model(mlp_section);
  Checkpoint m;
  cfg.model = mlp_section;
  m.model_config = json::parse(lt::config_to_json(cfg)).at("model").dump();
  for (auto& nt : lt::trainers::model_tensors(*mlp)) m.model.push_back({nt.name, nt.tensor.detach().clone()});
  write_checkpoint(path("mlp.h5"), m);
  msg = error_of<lt::ConfigError>([&] { lt::trainers::export_weights(path("mlp.h5"), "hf", path("out_mlp")); });
  EXPECT_CONTAINS(msg, "model.kind = mlp");
  EXPECT_CONTAINS(msg, "use --format safetensors");
  EXPECT_FALSE(lt::files::exists(path("out_mlp")));
  EXPECT_EQ(lt::trainers::export_weights(path("mlp.h5"), "safetensors", path("out_mlp")).size(), 1u);
  // And a good export: config.json + model.safetensors, nothing else.
  const auto written = lt::trainers::export_weights(path("ok.h5"), "hf", path("out3"));
  EXPECT_EQ(written.size(), 2u);
  EXPECT_EQ(lt::files::list_dir(path("out3")), (std::vector<std::string>{"config.json", "model.safetensors"}));
  const auto back = read_safetensors(path("out3/model.safetensors"));
  EXPECT_EQ(back.metadata.at("format"), "pt");
  // Exported, then imported again: the same tensors.
  auto model2 = lt::models::build_model(section);
  lt::trainers::init_model(path("out3"), section, *model2, false);
  auto a = lt::trainers::model_tensors(*model), b = lt::trainers::model_tensors(*model2);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i].tensor, b[i].tensor)) << a[i].name;
}

}  // namespace
