// Tests of the models layer: parameter counts of the standard architectures, forward shapes,
// the tied heads, the block runner, parameter names, config errors, and that gradients flow.
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>
#include <set>
#include <string>

#include <torch/torch.h>

#include "leantrain/models/model.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"

namespace lm = lt::models;

namespace {

lt::ModelConfig gpt_cfg(int64_t vocab, int64_t seq, int64_t layers, int64_t heads, int64_t d) {
  lt::ModelConfig c;
  c.kind = "gpt";
  c.vocab_size = vocab;
  c.seq_len = seq;
  c.n_layer = layers;
  c.n_head = heads;
  c.d_model = d;
  return c;
}

lt::ModelConfig tiny_gpt() { return gpt_cfg(37, 16, 3, 2, 32); }

lt::ModelConfig tiny_bert() {
  auto c = gpt_cfg(41, 16, 2, 4, 32);
  c.kind = "bert";
  return c;
}

lt::ModelConfig resnet_cfg(int64_t depth) {
  lt::ModelConfig c;
  c.kind = "resnet";
  c.depth = depth;
  c.in_channels = 3;
  c.num_classes = 1000;
  c.width = 64;
  c.stem = "imagenet";
  return c;
}

lt::ModelConfig tiny_resnet_small() {
  lt::ModelConfig c;
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

void expect_config_error(const lt::ModelConfig& c, const std::string& key) {
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
    lt::ModelConfig c;  // mlp defaults: 1x28x28, hidden {256, 256}, 10 classes
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
  std::vector<std::pair<lt::ModelConfig, torch::Tensor>> cases;
  cases.emplace_back(tiny_gpt(), torch::randint(37, {2, 16}, torch::kLong));
  cases.emplace_back(tiny_bert(), torch::randint(41, {2, 16}, torch::kLong));
  cases.emplace_back(tiny_resnet_small(), torch::randn({2, 1, 28, 28}));
  lt::ModelConfig mlp;
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

TEST(ModelsNames, Documented) {
  auto gpt = param_names(*lm::build_model(tiny_gpt()));
  for (const char* n :
       {"wte.weight", "wpe.weight", "blocks.0.ln1.weight", "blocks.0.ln1.bias",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.qkv.bias", "blocks.0.attn.proj.weight",
        "blocks.0.attn.proj.bias", "blocks.0.ln2.weight", "blocks.0.mlp.fc.weight",
        "blocks.0.mlp.fc.bias", "blocks.2.mlp.proj.weight", "blocks.2.mlp.proj.bias",
        "ln_f.weight", "ln_f.bias"}) {
    EXPECT_TRUE(gpt.count(n)) << "gpt: " << n;
  }
  EXPECT_EQ(gpt.size(), 2u + 3u * 12u + 2u);

  auto bert = param_names(*lm::build_model(tiny_bert()));
  for (const char* n :
       {"tok_emb.weight", "pos_emb.weight", "type_emb.weight", "emb_ln.weight", "emb_ln.bias",
        "blocks.0.attn.qkv.weight", "blocks.0.attn.proj.bias", "blocks.0.ln1.weight",
        "blocks.1.mlp.fc.weight", "blocks.1.mlp.proj.weight", "blocks.1.ln2.bias",
        "mlm.dense.weight", "mlm.dense.bias", "mlm.ln.weight", "mlm.ln.bias", "mlm.bias"}) {
    EXPECT_TRUE(bert.count(n)) << "bert: " << n;
  }

  auto rn = lm::build_model(resnet_cfg(50));
  auto resnet = param_names(*rn);
  for (const char* n :
       {"stem.conv.weight", "stem.bn.weight", "stem.bn.bias", "blocks.0.conv1.weight",
        "blocks.0.bn1.weight", "blocks.0.conv3.weight", "blocks.0.bn3.bias",
        "blocks.0.down.conv.weight", "blocks.0.down.bn.weight", "blocks.3.down.conv.weight",
        "blocks.15.conv2.weight", "fc.weight", "fc.bias"}) {
    EXPECT_TRUE(resnet.count(n)) << "resnet: " << n;
  }
  EXPECT_FALSE(resnet.count("blocks.1.down.conv.weight"));
  EXPECT_FALSE(resnet.count("stem.conv.bias"));
  std::set<std::string> buffers;
  for (const auto& b : rn->named_buffers()) buffers.insert(b.key());
  EXPECT_TRUE(buffers.count("stem.bn.running_mean"));
  EXPECT_TRUE(buffers.count("blocks.0.down.bn.running_var"));

  lt::ModelConfig mlp;
  mlp.hidden = {8};
  auto names = param_names(*lm::build_model(mlp));
  EXPECT_EQ(names, (std::set<std::string>{"blocks.0.fc.weight", "blocks.0.fc.bias",
                                          "head.weight", "head.bias"}));
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
  lt::ModelConfig mlp;
  mlp.hidden = {16, 0};
  expect_config_error(mlp, "model.hidden");
  mlp = lt::ModelConfig();
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
