// Tests of the models layer: parameter counts of the standard architectures, forward shapes,
// the tied heads, the block runner, parameter names, config errors, and that gradients flow.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "autograd_nodes.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/batch_norm_relu.h"
#include "leantrain/models/model.h"
#include "leantrain/models/resnet.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"

namespace lm = lt::models;

namespace {

lt::models::ModelConfig gpt_cfg(int64_t vocab, int64_t seq, int64_t layers, int64_t heads, int64_t d) {
  lt::models::ModelConfig c;
  c.kind = "gpt";
  c.vocab_size = vocab;
  c.seq_len = seq;
  c.n_layer = layers;
  c.n_head = heads;
  c.d_model = d;
  return c;
}

lt::models::ModelConfig tiny_gpt() { return gpt_cfg(37, 16, 3, 2, 32); }

lt::models::ModelConfig tiny_bert() {
  auto c = gpt_cfg(41, 16, 2, 4, 32);
  c.kind = "bert";
  return c;
}

lt::models::ModelConfig resnet_cfg(int64_t depth) {
  lt::models::ModelConfig c;
  c.kind = "resnet";
  c.depth = depth;
  c.in_channels = 3;
  c.num_classes = 1000;
  c.width = 64;
  c.stem = "imagenet";
  return c;
}

lt::models::ModelConfig tiny_resnet_small() {
  lt::models::ModelConfig c;
  c.kind = "resnet";
  c.depth = 0;
  c.layers = {1, 2};
  c.block = "basic";
  c.width = 8;
  c.stem = "small";
  c.in_channels = 1;
  c.num_classes = 10;
  return c;
}

std::set<std::string> param_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& p : m.named_parameters()) names.insert(p.key());
  return names;
}

void expect_near_rel(int64_t got, double want, double rel, const char* what) {
  std::cout << "[ params ] " << what << ": " << got << "\n";
  EXPECT_NEAR(static_cast<double>(got), want, want * rel) << what;
}

void expect_config_error(const lt::models::ModelConfig& c, const std::string& key) {
  try {
    lm::build_model(c);
    ADD_FAILURE() << "expected a ConfigError naming " << key;
  } catch (const lt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(key), std::string::npos)
        << "message: " << e.what() << " does not name " << key;
  }
}

}  // namespace

TEST(ModelsParams, Gpt2Small) {
  auto m = lm::build_model(gpt_cfg(50257, 1024, 12, 12, 768));
  expect_near_rel(lm::count_parameters(*m), 124439808.0, 0.01, "GPT-2 small");
  EXPECT_EQ(m->blocks().size(), 12u);
  EXPECT_EQ(m->task(), lm::Task::kCausalLM);
}

TEST(ModelsParams, BertBase) {
  auto c = gpt_cfg(30522, 512, 12, 12, 768);
  c.kind = "bert";
  auto m = lm::build_model(c);
  expect_near_rel(lm::count_parameters(*m), 110e6, 0.02, "BERT-base (MLM head)");
  EXPECT_EQ(m->blocks().size(), 12u);
  EXPECT_EQ(m->task(), lm::Task::kMaskedLM);
}

TEST(ModelsParams, ResNet50) {
  auto m = lm::build_model(resnet_cfg(50));
  expect_near_rel(lm::count_parameters(*m), 25557032.0, 0.01, "ResNet-50");
  EXPECT_EQ(m->blocks().size(), 16u);
}

TEST(ModelsParams, ResNet18) {
  auto m = lm::build_model(resnet_cfg(18));
  expect_near_rel(lm::count_parameters(*m), 11689512.0, 0.01, "ResNet-18");
  EXPECT_EQ(m->blocks().size(), 8u);
}

TEST(ModelsParams, CountsTiedWeightOnce) {
  auto lin = torch::nn::Linear(4, 3);
  torch::nn::Module holder;
  holder.register_module("a", lin);
  holder.register_module("b", lin);  // the same module twice: its weights count once
  EXPECT_EQ(lm::count_parameters(holder), 4 * 3 + 3);
}

TEST(ModelsForward, Shapes) {
  torch::manual_seed(0);
  {
    auto m = lm::build_model(tiny_gpt());
    auto y = m->forward(torch::randint(37, {2, 16}, torch::kLong));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 16, 37}));
    EXPECT_EQ(m->blocks().size(), 3u);
    // Shorter sequences than seq_len work too.
    EXPECT_EQ(m->forward(torch::randint(37, {3, 5}, torch::kLong)).sizes(),
              (std::vector<int64_t>{3, 5, 37}));
  }
  {
    auto m = lm::build_model(tiny_bert());
    auto y = m->forward(torch::randint(41, {2, 12}, torch::kLong));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 12, 41}));
    EXPECT_EQ(m->blocks().size(), 2u);
  }
  {
    auto m = lm::build_model(tiny_resnet_small());
    auto y = m->forward(torch::randn({2, 1, 28, 28}));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 10}));
    EXPECT_EQ(m->blocks().size(), 3u);
    EXPECT_EQ(m->task(), lm::Task::kClassify);
  }
  {
    auto c = tiny_resnet_small();
    c.block = "bottleneck";
    c.layers = {1, 1};
    c.stem = "imagenet";
    c.in_channels = 3;
    auto m = lm::build_model(c);
    auto y = m->forward(torch::randn({2, 3, 32, 32}));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 10}));
    EXPECT_EQ(m->blocks().size(), 2u);
    // Bottleneck output is 4 * planes: the last stage has 8 * 2 * 4 = 64 channels.
    auto params = m->named_parameters();
    EXPECT_EQ(params["fc.weight"].sizes(), (std::vector<int64_t>{10, 64}));
  }
  {
    lt::models::ModelConfig c;  // mlp defaults: 1x28x28, hidden {256, 256}, 10 classes
    c.hidden = {32, 16, 8};
    c.dropout = 0.1;
    auto m = lm::build_model(c);
    auto y = m->forward(torch::randn({4, 1, 28, 28}));
    EXPECT_EQ(y.sizes(), (std::vector<int64_t>{4, 10}));
    EXPECT_EQ(m->blocks().size(), 3u);
  }
}

TEST(ModelsForward, GptTiedHead) {
  torch::manual_seed(1);
  auto m = lm::build_model(tiny_gpt());
  auto names = param_names(*m);
  for (const auto& n : names) {
    EXPECT_EQ(n.find("head"), std::string::npos) << n;
    EXPECT_EQ(n.find("lm_head"), std::string::npos) << n;
  }
  // Every parameter is accounted for by the documented layout (no extra V x D matrix).
  const int64_t v = 37, s = 16, d = 32, f = 4 * 32, l = 3;
  const int64_t per_block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (f * d + f) +
                            (d * f + d);
  EXPECT_EQ(lm::count_parameters(*m), v * d + s * d + l * per_block + 2 * d);

  m->eval();
  auto ids = torch::randint(v, {2, 8}, torch::kLong);
  auto before = m->forward(ids).detach().clone();
  {
    torch::NoGradGuard ng;
    m->named_parameters()["wte.weight"].mul_(2.0);
  }
  auto after = m->forward(ids).detach();
  EXPECT_FALSE(torch::allclose(before, after));
  // The gradient of the logits reaches wte through the head as well as the embedding lookup:
  // a token that never appears in the input still gets a gradient.
  m->zero_grad();
  auto ids0 = torch::zeros({1, 4}, torch::kLong);
  m->forward(ids0).sum().backward();
  auto g = m->named_parameters()["wte.weight"].grad();
  ASSERT_TRUE(g.defined());
  EXPECT_GT(g[5].abs().sum().item<double>(), 0.0);
}

TEST(ModelsForward, BertTiedDecoder) {
  auto m = lm::build_model(tiny_bert());
  auto names = param_names(*m);
  EXPECT_TRUE(names.count("mlm.bias"));
  EXPECT_EQ(m->named_parameters()["mlm.bias"].sizes(), (std::vector<int64_t>{41}));
  for (const auto& n : names) EXPECT_EQ(n.find("decoder"), std::string::npos) << n;
}

TEST(ModelsBlocks, RunnerCalledOncePerBlockSameOutput) {
  torch::manual_seed(2);
  std::vector<std::pair<lt::models::ModelConfig, torch::Tensor>> cases;
  cases.emplace_back(tiny_gpt(), torch::randint(37, {2, 16}, torch::kLong));
  cases.emplace_back(tiny_bert(), torch::randint(41, {2, 16}, torch::kLong));
  cases.emplace_back(tiny_resnet_small(), torch::randn({2, 1, 28, 28}));
  lt::models::ModelConfig mlp;
  mlp.hidden = {16, 16};
  cases.emplace_back(mlp, torch::randn({3, 1, 28, 28}));
  for (auto& [cfg, input] : cases) {
    SCOPED_TRACE(cfg.kind);
    auto m = lm::build_model(cfg);
    m->eval();
    auto plain = m->forward(input).detach().clone();
    std::vector<size_t> calls;
    m->set_block_runner([&](size_t i, lm::BlockImpl& b, const torch::Tensor& x) {
      EXPECT_EQ(&b, m->blocks()[i].get());
      calls.push_back(i);
      return b.forward(x);
    });
    auto run = m->forward(input).detach();
    ASSERT_EQ(calls.size(), m->blocks().size());
    for (size_t i = 0; i < calls.size(); ++i) EXPECT_EQ(calls[i], i);
    EXPECT_TRUE(torch::equal(plain, run));
    m->set_block_runner(nullptr);  // an empty runner: back to block->forward
    calls.clear();
    EXPECT_TRUE(torch::equal(plain, m->forward(input).detach()));
    EXPECT_TRUE(calls.empty());
  }
}

// The parameter names each model header documents (its "Parameter names
// (named_parameters())" comment block, as model.h promises) are read from the header and
// compared with named_parameters(): the same set, with the block index written `i`, and for
// the transformers the documented shapes evaluated from the config. `a.weight/bias` and
// `a.*` (a BatchNorm) stand for `a.weight` and `a.bias`. A renamed parameter or an edited
// comment fails here. docs/CHECKPOINTS.md's example dataset names must exist too.
struct DocumentedName {
  std::string shape;  // the text inside [...] after the name, "" when none is given
};

std::string read_source(const std::string& rel) {
  std::ifstream in(std::string(LEANTRAIN_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in.good()) << "cannot read " << rel;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The indented lines ("//   ...") that follow the "Parameter names (named_parameters())"
// line of a header comment (skipping the rest of that sentence), up to the first line that
// is not indented.
std::string names_block(const std::string& header) {
  std::istringstream in(header);
  std::string line, block;
  bool in_intro = false, in_block = false;
  while (std::getline(in, line)) {
    if (!in_intro && !in_block) {
      in_intro = line.find("Parameter names (named_parameters())") != std::string::npos;
      continue;
    }
    const bool indented = line.rfind("//   ", 0) == 0;
    if (in_intro && !indented) continue;  // the sentence goes on
    in_intro = false;
    if (!indented) break;
    in_block = true;
    block += line.substr(2) + "\n";
  }
  return block;
}

std::map<std::string, DocumentedName> documented_names(const std::string& header_rel) {
  const std::string block = names_block(read_source(header_rel));
  EXPECT_FALSE(block.empty()) << header_rel << " has no parameter-name block";
  static const std::regex name(R"(\b([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*\.(?:weight/bias|weight|bias|\*))(?:\s*\[([^\]]*)\])?)");
  std::map<std::string, DocumentedName> out;
  for (auto it = std::sregex_iterator(block.begin(), block.end(), name); it != std::sregex_iterator(); ++it) {
    std::string n = (*it)[1].str();
    const std::string shape = (*it)[2].matched ? (*it)[2].str() : "";
    std::vector<std::string> expanded;
    for (const std::string both : {".weight/bias", ".*"})
      if (n.size() > both.size() && n.compare(n.size() - both.size(), both.size(), both) == 0) {
        const std::string stem = n.substr(0, n.size() - both.size());
        expanded = {stem + ".weight", stem + ".bias"};
      }
    if (expanded.empty()) expanded = {n};
    for (const auto& e : expanded) {
      EXPECT_FALSE(out.count(e)) << header_rel << " documents " << e << " twice";
      out[e] = {shape};
    }
  }
  return out;
}

// "blocks.12.conv1.weight" -> "blocks.i.conv1.weight".
std::string generic(const std::string& n) {
  static const std::regex index(R"((^|\.)[0-9]+(?=\.|$))");
  return std::regex_replace(n, index, "$1i");
}

// A documented shape such as "3D,D" or "V, D" evaluated with the config's sizes.
std::vector<int64_t> eval_shape(const std::string& text, const std::map<std::string, int64_t>& sym) {
  std::vector<int64_t> dims;
  std::stringstream ss(text);
  static const std::regex term(R"(\s*([0-9]*)\s*([A-Za-z_][A-Za-z0-9_]*)?\s*)");
  for (std::string part; std::getline(ss, part, ',');) {
    std::smatch m;
    if (!std::regex_match(part, m, term) || (m[1].length() == 0 && m[2].length() == 0)) {
      ADD_FAILURE() << "cannot read the documented shape [" << text << "]";
      return {};
    }
    int64_t v = m[1].length() ? std::stoll(m[1].str()) : 1;
    if (m[2].length()) {
      const auto it = sym.find(m[2].str());
      if (it == sym.end()) {
        ADD_FAILURE() << "unknown size " << m[2].str() << " in the documented shape [" << text << "]";
        return {};
      }
      v *= it->second;
    }
    dims.push_back(v);
  }
  return dims;
}

// named_parameters() against the header: every parameter documented, every documented name
// present; with `sym`, every documented shape equal to the parameter's.
void expect_documented(const lm::Model& m, const std::string& header_rel,
                       const std::map<std::string, int64_t>* sym = nullptr) {
  SCOPED_TRACE(header_rel);
  const auto doc = documented_names(header_rel);
  std::set<std::string> seen;
  for (const auto& p : m.named_parameters()) {
    const std::string g = generic(p.key());
    const bool first = seen.insert(g).second;
    const auto it = doc.find(g);
    if (it == doc.end()) {
      if (first) ADD_FAILURE() << p.key() << " (" << g << ") is not documented";
      continue;
    }
    if (sym != nullptr) {
      EXPECT_FALSE(it->second.shape.empty()) << g << " has no documented shape";
      if (!it->second.shape.empty())
        EXPECT_EQ(eval_shape(it->second.shape, *sym), p.value().sizes().vec())
            << p.key() << ": documented [" << it->second.shape << "]";
    }
  }
  for (const auto& [n, d] : doc) EXPECT_TRUE(seen.count(n)) << n << " is documented but not a parameter";
}

std::set<std::string> buffer_names(const torch::nn::Module& m) {
  std::set<std::string> names;
  for (const auto& b : m.named_buffers()) names.insert(b.key());
  return names;
}

TEST(ModelsNames, Documented) {
  // GPT: D = d_model, F = 4D (d_ff 0), V = vocab_size, S = seq_len.
  const auto g = tiny_gpt();
  auto gpt = lm::build_model(g);
  const std::map<std::string, int64_t> gsym = {{"D", g.d_model}, {"F", 4 * g.d_model}, {"V", g.vocab_size},
                                               {"S", g.seq_len}};
  expect_documented(*gpt, "models/include/leantrain/models/gpt.h", &gsym);
  EXPECT_EQ(param_names(*gpt).size(), 2u + 3u * 12u + 2u);  // 12 per block, every block
  ASSERT_NE(read_source("models/include/leantrain/models/gpt.h").find("\n// No buffers."), std::string::npos);
  EXPECT_TRUE(buffer_names(*gpt).empty());

  // BERT: the same letters and Y = type_vocab_size.
  const auto b = tiny_bert();
  auto bert = lm::build_model(b);
  const std::map<std::string, int64_t> bsym = {{"D", b.d_model}, {"F", 4 * b.d_model}, {"V", b.vocab_size},
                                               {"S", b.seq_len}, {"Y", b.type_vocab_size}};
  expect_documented(*bert, "models/include/leantrain/models/bert.h", &bsym);
  ASSERT_NE(read_source("models/include/leantrain/models/bert.h").find("\n// No buffers."), std::string::npos);
  EXPECT_TRUE(buffer_names(*bert).empty());

  // ResNet-50 has every documented kind of name (bottlenecks, downsampling); ResNet-18's
  // basic blocks only a subset of them. Names only: the documented shapes are in words.
  auto rn = lm::build_model(resnet_cfg(50));
  expect_documented(*rn, "models/include/leantrain/models/resnet.h");
  const auto rdoc = documented_names("models/include/leantrain/models/resnet.h");
  for (const auto& n : param_names(*lm::build_model(resnet_cfg(18))))
    EXPECT_TRUE(rdoc.count(generic(n))) << "resnet-18: " << n;
  EXPECT_FALSE(param_names(*rn).count("blocks.1.down.conv.weight"));  // shape kept: no downsampling
  // Buffers (documented in words): running_mean, running_var, num_batches_tracked of every BN.
  std::set<std::string> want_buffers;
  for (const auto& n : param_names(*rn)) {
    const auto dot = n.rfind(".weight");
    const auto last = n.rfind('.', dot - 1);
    const std::string module = n.substr(0, dot);
    if (dot != std::string::npos && dot + 7 == n.size() && module.compare(last + 1, 2, "bn") == 0)
      for (const char* suffix : {".running_mean", ".running_var", ".num_batches_tracked"})
        want_buffers.insert(module + suffix);
  }
  EXPECT_EQ(want_buffers.size(), 3u * (1u + 16u * 3u + 4u));  // stem, 3 per bottleneck, 4 downsamplings
  EXPECT_EQ(buffer_names(*rn), want_buffers);

  lt::models::ModelConfig mlp;
  mlp.hidden = {8, 4};
  expect_documented(*lm::build_model(mlp), "models/include/leantrain/models/mlp.h");
  EXPECT_EQ(param_names(*lm::build_model(mlp)).size(), 6u);

  // docs/CHECKPOINTS.md names datasets "exactly as named_parameters() / named_buffers()": its
  // examples in the /model/<name> section are names of these models.
  const std::string doc = read_source("docs/CHECKPOINTS.md");
  const auto from = doc.find("### `/model/<name>`");
  ASSERT_NE(from, std::string::npos);
  const std::string section = doc.substr(from, doc.find("\n### ", from + 1) - from);
  std::set<std::string> known = param_names(*gpt);
  for (const auto* model : {bert.get(), rn.get()}) {
    for (const auto& n : param_names(*model)) known.insert(n);
    for (const auto& n : buffer_names(*model)) known.insert(n);
  }
  // Tensor names: dotted, ending in a parameter's or a buffer's leaf (not `precision.mode`).
  static const std::regex example(
      R"(`([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)*\.(?:weight|bias|running_mean|running_var|num_batches_tracked))`)");
  size_t examples = 0;
  for (auto it = std::sregex_iterator(section.begin(), section.end(), example); it != std::sregex_iterator(); ++it) {
    ++examples;
    EXPECT_TRUE(known.count((*it)[1].str())) << "docs/CHECKPOINTS.md names " << (*it)[1].str();
  }
  EXPECT_GE(examples, 2u);
}

TEST(ModelsConfig, BadValuesNameTheKey) {
  auto c = tiny_gpt();
  c.n_head = 5;  // 32 % 5 != 0
  expect_config_error(c, "model.n_head");
  c = tiny_gpt();
  c.kind = "transformer";
  expect_config_error(c, "model.kind");
  c = tiny_gpt();
  c.vocab_size = 0;
  expect_config_error(c, "model.vocab_size");
  c = tiny_bert();
  c.dropout = 1.0;
  expect_config_error(c, "model.dropout");
  c = tiny_bert();
  c.type_vocab_size = 0;
  expect_config_error(c, "model.type_vocab_size");
  c = resnet_cfg(20);
  expect_config_error(c, "model.depth");
  c = resnet_cfg(0);
  expect_config_error(c, "model.layers");  // depth 0 without layers
  c = tiny_resnet_small();
  c.block = "wide";
  expect_config_error(c, "model.block");
  c = tiny_resnet_small();
  c.stem = "cifar";
  expect_config_error(c, "model.stem");
  c = tiny_resnet_small();
  c.layers = {2, 0};
  expect_config_error(c, "model.layers");
  c = tiny_resnet_small();
  c.bn_relu = "yes";
  expect_config_error(c, "model.bn_relu");
  lt::models::ModelConfig mlp;
  mlp.hidden = {16, 0};
  expect_config_error(mlp, "model.hidden");
  mlp = lt::models::ModelConfig();
  mlp.num_classes = 0;
  expect_config_error(mlp, "model.num_classes");
}

TEST(ModelsLoss, IgnoreIndexAndClassify) {
  auto logits = torch::randn({2, 3, 5});
  auto target = torch::tensor({1, -100, 2, -100, -100, 4}, torch::kLong).view({2, 3});
  auto loss = lm::compute_loss(lm::Task::kCausalLM, logits, target);
  auto flat = logits.view({6, 5});
  auto want = (torch::nn::functional::cross_entropy(flat[0].unsqueeze(0), target[0][0].view({1})) +
               torch::nn::functional::cross_entropy(flat[2].unsqueeze(0), target[0][2].view({1})) +
               torch::nn::functional::cross_entropy(flat[5].unsqueeze(0), target[1][2].view({1}))) /
              3.0;
  EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-5);
  auto cl = torch::randn({4, 10});
  auto ct = torch::tensor({0, 3, 9, 1}, torch::kLong);
  EXPECT_NEAR(lm::compute_loss(lm::Task::kClassify, cl, ct).item<double>(),
              torch::nn::functional::cross_entropy(cl, ct).item<double>(), 1e-6);
}

TEST(ModelsTrain, TinyGptOverfitsOneBatch) {
  torch::manual_seed(3);
  auto c = gpt_cfg(32, 16, 2, 2, 32);
  auto m = lm::build_model(c);
  m->train();
  auto seq = torch::randint(32, {4, 17}, torch::kLong);
  auto input = seq.slice(1, 0, 16), target = seq.slice(1, 1, 17);
  torch::optim::AdamW opt(m->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.0));
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    auto loss = lm::compute_loss(m->task(), m->forward(input), target);
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  std::cout << "[ overfit ] loss " << first << " -> " << last << "\n";
  EXPECT_NEAR(first, std::log(32.0), 0.5);
  EXPECT_LT(last, 0.5 * first);
}

// The model's keys are checked here, once (runtime's validate leaves them to models/).
TEST(ModelConfigCheck, HeadsMustDivideTheWidthAndRecomputeMustParse) {
  lt::models::ModelConfig c;
  c.kind = "gpt";
  c.d_model = 100;
  c.n_head = 3;
  try {
    lm::check_model_config(c);
    ADD_FAILURE() << "d_model 100 with 3 heads was accepted";
  } catch (const lt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_head"), std::string::npos) << e.what();
  }
  c.n_head = 4;
  EXPECT_NO_THROW(lm::check_model_config(c));
  for (const char* bad : {"every:0", "every:", "sometimes", "auto"}) {
    try {
      lm::RecomputePolicy::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const lt::ConfigError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("memory.recompute = '" + std::string(bad) + "'"), std::string::npos) << m;
    }
  }
  EXPECT_EQ(lm::RecomputePolicy::parse("every:3").every, 3);
}

// Note [Fused BatchNorm and ReLU]: bn_relu against the module followed by torch::relu, on the
// same parameters and running statistics: output, running statistics and num_batches_tracked,
// and the input, weight and bias gradients, to fp32 rounding; with a mean far from zero (the
// variance from the sums of squares) and with momentum = None (the cumulative average). The
// fused op is deterministic (a checkpoint's rerun must reproduce its forward), and the cases it
// does not fuse (NCHW, eval, bf16, fused = false) run the two ops themselves, bitwise.
TEST(Models, FusedBatchNormReluMatchesUnfused) {
  torch::manual_seed(3);
  struct Case {
    std::vector<int64_t> shape;
    double offset;
    bool cumulative;
  };
  for (const auto& k : {Case{{4, 16, 7, 5}, 0.0, false}, Case{{2, 64, 9, 9}, 3.0, false},
                        Case{{8, 8, 1, 1}, -1.0, true}, Case{{3, 300, 4, 6}, 0.5, false}}) {
    const int64_t c = k.shape[1];
    auto opts = torch::nn::BatchNorm2dOptions(c);
    if (k.cumulative) opts.momentum(c10::nullopt);
    torch::nn::BatchNorm2d fused(opts), plain(opts);
    {
      torch::NoGradGuard no_grad;
      for (auto* m : {&fused, &plain}) {
        (*m)->weight.copy_(torch::linspace(0.5, 1.5, c));
        (*m)->bias.copy_(torch::linspace(-0.2, 0.3, c));
        (*m)->running_mean.copy_(torch::linspace(-0.1, 0.1, c));
        (*m)->running_var.copy_(torch::linspace(0.8, 1.2, c));
      }
    }
    const auto x0 = (torch::randn(k.shape) * 2 + k.offset).contiguous(at::MemoryFormat::ChannelsLast);
    const auto g = torch::randn(k.shape).contiguous(at::MemoryFormat::ChannelsLast);
    const std::string what = "shape " + c10::str(c10::IntArrayRef(k.shape)) + " offset " + std::to_string(k.offset);
    ASSERT_TRUE(lm::bn_relu_fuses(*fused, x0)) << what;
    auto xf = x0.clone().requires_grad_(true);
    auto xp = x0.clone().requires_grad_(true);
    std::vector<torch::Tensor> yf_runs;
    for (int step = 0; step < 2; ++step) {  // two steps: the running statistics move twice
      for (auto* m : {&fused, &plain}) (*m)->zero_grad();
      if (xf.grad().defined()) xf.mutable_grad().zero_();
      if (xp.grad().defined()) xp.mutable_grad().zero_();
      const auto yf = lm::bn_relu(*fused, xf, true);
      const auto yp = torch::relu(plain->forward(xp));
      EXPECT_TRUE(yf.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
      EXPECT_TRUE(torch::allclose(yf, yp, 1e-5, 1e-5)) << what << ": max diff " << (yf - yp).abs().max().item<float>();
      EXPECT_GT((yf == 0).sum().item<int64_t>(), 0) << what << ": the ReLU clips somewhere";
      (yf * g).sum().backward();
      (yp * g).sum().backward();
      EXPECT_TRUE(torch::allclose(xf.grad(), xp.grad(), 1e-4, 1e-5))
          << what << ": dx max diff " << (xf.grad() - xp.grad()).abs().max().item<float>();
      EXPECT_TRUE(torch::allclose(fused->weight.grad(), plain->weight.grad(), 1e-4, 1e-4)) << what;
      EXPECT_TRUE(torch::allclose(fused->bias.grad(), plain->bias.grad(), 1e-4, 1e-4)) << what;
      EXPECT_TRUE(torch::allclose(fused->running_mean, plain->running_mean, 1e-5, 1e-6)) << what;
      EXPECT_TRUE(torch::allclose(fused->running_var, plain->running_var, 1e-5, 1e-6)) << what;
      EXPECT_EQ(fused->num_batches_tracked.item<int64_t>(), plain->num_batches_tracked.item<int64_t>()) << what;
      yf_runs.push_back(yf.detach());
    }
    // Deterministic: the same input and statistics give the same bits (a rerun's contract).
    torch::nn::BatchNorm2d again(opts);
    {
      torch::NoGradGuard no_grad;
      again->weight.copy_(fused->weight);
      again->bias.copy_(fused->bias);
    }
    const auto y1 = lm::bn_relu(*again, x0, true);
    const auto y2 = lm::bn_relu(*again, x0, true);
    EXPECT_TRUE(torch::equal(y1, y2)) << what;
  }
  // Not fused: the module, then torch::relu, bitwise.
  torch::nn::BatchNorm2d bn(8);
  const auto x = torch::randn({2, 8, 3, 3});
  const auto xcl = x.contiguous(at::MemoryFormat::ChannelsLast);
  EXPECT_FALSE(lm::bn_relu_fuses(*bn, x)) << "NCHW";
  EXPECT_FALSE(lm::bn_relu_fuses(*bn, xcl.to(torch::kBFloat16))) << "bf16";
  EXPECT_FALSE(lm::bn_relu_fuses(*bn, torch::randn({1, 8, 1, 1}).contiguous(at::MemoryFormat::ChannelsLast)))
      << "one value per channel";
  EXPECT_TRUE(lm::bn_relu_fuses(*bn, xcl));
  bn->eval();
  EXPECT_FALSE(lm::bn_relu_fuses(*bn, xcl)) << "eval";
  EXPECT_TRUE(torch::equal(lm::bn_relu(*bn, xcl, true), torch::relu(bn->forward(xcl))));
  bn->train();
  torch::nn::BatchNorm2d twin(8);
  EXPECT_TRUE(torch::equal(lm::bn_relu(*bn, x, true), torch::relu(twin->forward(x)))) << "NCHW runs the two ops";
  EXPECT_TRUE(torch::equal(lm::bn_relu(*bn, xcl, false), torch::relu(twin->forward(xcl)))) << "fused = false";
}

// model.bn_relu: a small bottleneck ResNet (channels-last) trains the same with the pairs fused
// as with the two ops, to rounding: loss, every gradient and the BatchNorm statistics after a
// step.
TEST(Models, ResNetFusedBatchNormReluMatchesSeparate) {
  auto c = tiny_resnet_small();
  c.block = "bottleneck";
  c.stem = "imagenet";
  c.layers = {1, 2};
  c.in_channels = 3;
  c.image_size = 32;
  std::map<std::string, torch::Tensor> got[2];
  float loss[2] = {0, 0};
  const auto x = torch::randn({4, 3, 32, 32});
  const auto y = torch::randint(0, 10, {4});
  for (int fused = 0; fused < 2; ++fused) {
    c.bn_relu = fused ? "fused" : "separate";
    torch::manual_seed(11);
    auto model = lm::build_model(c);
    {
      // Off the initial values (the last norms start at zero, which would zero the branches'
      // gradients): the same draws for both models.
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters())
        if (p.dim() == 1) p.add_(torch::randn_like(p) * 0.2);
    }
    model->train();
    const auto l = model->forward_loss(x, y);
    // The fused model runs its 7 pairs (the stem's, bn1 and bn2 of 3 bottlenecks) fused.
    EXPECT_EQ(lt_test::count_nodes(l, "BatchNormRelu"), fused ? 7 : 0) << c.bn_relu;
    l.backward();
    loss[fused] = l.item<float>();
    for (const auto& p : model->named_parameters()) got[fused][p.key() + ".grad"] = p.value().grad().clone();
    for (const auto& b : model->named_buffers()) got[fused]["buffer " + b.key()] = b.value().clone();
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-5 * std::abs(loss[0]));
  ASSERT_EQ(got[0].size(), got[1].size());
  for (const auto& [name, t] : got[0]) {
    const auto& f = got[1].at(name);
    if (t.scalar_type() == torch::kLong) {
      EXPECT_TRUE(torch::equal(t, f)) << name;
      continue;
    }
    const double scale = t.abs().max().item<double>();
    EXPECT_LE((f - t).abs().max().item<double>(), 1e-4 * scale + 1e-6) << name << " (max " << scale << ")";
  }
}
