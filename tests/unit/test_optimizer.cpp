// Note [Chunked AdamW]: the chunked AdamW step equals LibTorch's bit for bit, with bounded
// temporaries. Note [Fused update]: FusedAdamW (train.optimizer = adamw) through apply_update
// against PyTorch's AdamW(fused=True) + GradScaler + clip_grad_norm_, step by step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/optimizer.h"
#include "leantrain/trainers/precision.h"

namespace {

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  // One parameter of 2.3 chunks (not a multiple of the chunk), one of a few elements, one
  // matrix below a chunk, and one that gets no gradient.
  return {torch::randn({600, 1000}), torch::randn({17}), torch::randn({64, 64}), torch::randn({5})};
}

template <class Opt>
std::unique_ptr<Opt> make(std::vector<torch::Tensor>& params) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto opts = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[2]}, opts(0.1));
  groups.emplace_back(std::vector<torch::Tensor>{params[1], params[3]}, opts(0.0));
  return std::make_unique<Opt>(std::move(groups), torch::optim::AdamWOptions(3e-3));
}

TEST(ChunkedAdamW, EqualsLibTorchAdamWBitwise) {
  auto a = make_params(), b = make_params();
  for (auto* set : {&a, &b})
    for (auto& p : *set) p.requires_grad_(true);
  auto stock = make<torch::optim::AdamW>(a);
  auto chunked = make<lt::trainers::ChunkedAdamW>(b);
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      const auto g = torch::randn(a[i].sizes()) * (i + 1);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    stock->step();
    chunked->step();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(torch::equal(a[i], b[i])) << "step " << step + 1 << " parameter " << i;
      auto sa = stock->state().find(a[i].unsafeGetTensorImpl());
      auto sb = chunked->state().find(b[i].unsafeGetTensorImpl());
      ASSERT_EQ(sa == stock->state().end(), sb == chunked->state().end()) << i;
      if (sa == stock->state().end()) continue;
      const auto& x = static_cast<torch::optim::AdamWParamState&>(*sa->second);
      const auto& y = static_cast<torch::optim::AdamWParamState&>(*sb->second);
      EXPECT_EQ(x.step(), y.step());
      EXPECT_TRUE(torch::equal(x.exp_avg(), y.exp_avg())) << i;
      EXPECT_TRUE(torch::equal(x.exp_avg_sq(), y.exp_avg_sq())) << i;
    }
  }
  EXPECT_EQ(chunked->state().count(b[3].unsafeGetTensorImpl()), 0u) << "no gradient, no state";
}

// The update of a 16 MiB parameter: LibTorch's allocates two temporaries its size, the
// chunked one two of 1 MiB.
template <class Opt>
int64_t update_extra_bytes() {
  std::vector<torch::Tensor> params = {torch::randn({4 << 20}).requires_grad_(true)};
  params[0].mutable_grad() = torch::randn({4 << 20});
  Opt opt(params, torch::optim::AdamWOptions(1e-3));
  opt.step();  // allocates the moments
  lt::MemoryMeter meter(-1);
  meter.reset_peak();
  const int64_t before = meter.stats().current_bytes;
  opt.step();
  return meter.stats().peak_bytes - before;
}

TEST(ChunkedAdamW, TemporariesAreBoundedByTheChunk) {
  const int64_t stock = update_extra_bytes<torch::optim::AdamW>();
  const int64_t chunked = update_extra_bytes<lt::trainers::ChunkedAdamW>();
  RecordProperty("stock_extra_bytes", std::to_string(stock));
  RecordProperty("chunked_extra_bytes", std::to_string(chunked));
  EXPECT_GE(stock, 2 * (16 << 20));
  EXPECT_LE(chunked, 3 << 20);
}

TEST(FusedAdamW, NoTemporaries) {
  EXPECT_LE(update_extra_bytes<lt::trainers::FusedAdamW>(), 64 << 10);
}

torch::Tensor tensor_of(const nlohmann::json& values, torch::IntArrayRef shape) {
  std::vector<float> flat;
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& v) {
    if (v.is_array()) {
      for (const auto& x : v) walk(x);
    } else {
      flat.push_back(v.is_null() ? std::numeric_limits<float>::infinity() : v.get<float>());
    }
  };
  walk(values);
  return torch::tensor(flat).reshape(shape);
}

// tests/scripts/fused_optimizer_reference.py: the same scaled gradients through PyTorch's recipe
// (AdamW and SGD-momentum, fused=True), and through make_optimizer + apply_update here.
TEST(FusedOptimizers, MatchPyTorchsFusedAdamWAndSgdWithGradScalerAndClipping) {
  std::ifstream in(LEANTRAIN_FUSED_OPTIMIZER_JSON);
  ASSERT_TRUE(in) << "missing " << LEANTRAIN_FUSED_OPTIMIZER_JSON << " (made by tests/scripts/fused_optimizer_reference.py)";
  const auto ref = nlohmann::json::parse(in);
  const std::map<std::string, std::vector<int64_t>> shapes = {{"w1", {8, 16}}, {"b1", {16}}, {"w2", {4, 8}}};
  for (const auto& [name, c] : ref["cases"].items()) {
    SCOPED_TRACE(name);
    std::map<std::string, torch::Tensor> p;
    for (const auto& [n, shape] : shapes) p[n] = tensor_of(c["init"][n], shape).requires_grad_(true);
    // The optimizer as make_optimizer builds it: two groups, weight decay on matrices only.
    const bool sgd = c["optimizer"] == "sgd";
    lt::TrainConfig t;
    t.optimizer = c["optimizer"];
    const auto& o = ref[sgd ? "sgd" : "optimizer"];
    t.lr = o["lr"];
    t.weight_decay = o["weight_decay"];
    if (sgd) {
      t.momentum = o["momentum"];
    } else {
      t.beta1 = o["betas"][0];
      t.beta2 = o["betas"][1];
      t.eps = o["eps"];
    }
    torch::nn::Module holder;
    holder.register_parameter("w1", p["w1"]);
    holder.register_parameter("b1", p["b1"]);
    holder.register_parameter("w2", p["w2"]);
    auto optimizer = lt::trainers::make_optimizer(t, holder);
    auto& opt = *optimizer;
    ASSERT_NE(dynamic_cast<lt::trainers::ScaledStep*>(&opt), nullptr);
    lt::PrecisionConfig pc;
    pc.init_scale = ref["scaler"]["init_scale"];
    pc.growth_factor = ref["scaler"]["growth_factor"];
    pc.backoff_factor = ref["scaler"]["backoff_factor"];
    pc.growth_interval = ref["scaler"]["growth_interval"];
    lt::trainers::LossScaler scaler(pc, c["fp16"].get<bool>(), torch::kCPU);
    lt::comm::LocalCommunicator comm;
    const std::vector<torch::Tensor> params = {p["w1"], p["b1"], p["w2"]};
    int i = 0, skipped = 0;
    double worst = 0;
    for (const auto& s : c["steps"]) {
      SCOPED_TRACE("step " + std::to_string(i++));
      EXPECT_EQ(scaler.scale_value(), s["scale_before"].get<double>());
      for (const auto& [n, shape] : shapes) p[n].mutable_grad() = tensor_of(s["grads"][n], shape);
      if (s["overflow"].get<int>()) p["w1"].mutable_grad()[0][0] = std::numeric_limits<float>::infinity();
      const bool stepped = lt::trainers::apply_update(opt, scaler, params, c["clip"].get<double>(), comm);
      EXPECT_EQ(stepped, s["overflow"].get<int>() == 0);
      skipped += !stepped;
      for (const auto& [n, shape] : shapes) {
        const auto want = tensor_of(s["params"][n], shape);
        const double diff = (p[n].detach() - want).abs().max().item<double>() / want.abs().max().item<double>();
        worst = std::max(worst, diff);
        EXPECT_LE(diff, 1e-6) << n;
      }
      if (!sgd && opt.state().count(p["w1"].unsafeGetTensorImpl())) {
        auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p["w1"].unsafeGetTensorImpl()));
        EXPECT_EQ(st.step(), s["step"].get<int64_t>());
      }
      EXPECT_EQ(scaler.scale_value(), s["scale_after"].get<double>());
    }
    EXPECT_EQ(i, 20);
    EXPECT_EQ(skipped, c["fp16"].get<bool>() ? 4 : 0);
    EXPECT_EQ(ref["cases"].size(), 5u);
    RecordProperty(name + "_max_rel_diff", std::to_string(worst));
    std::cout << name << ": max relative difference to PyTorch over 20 steps " << worst << "\n";
  }
}

}  // namespace

namespace {

// What the budget minimum and the planner count per rank (model_state_bytes): the optimizer
// state over N ranks, and under stage 2 this rank's gradient chunks, at 2 bytes an element
// with bf16 sums.
TEST(ModelStateBytes, ShardStagesAndBf16SumsDivideWhatTheyShard) {
  lt::Config cfg;
  cfg.train.optimizer = "adamw";
  const std::vector<int64_t> numels = {1000000, 3000, 1};  // 1,003,001 elements: 4,012,004 bytes
  const int64_t p = 4 * 1003001;
  auto at = [&](const std::string& shard, const std::string& sums, int world) {
    lt::Config c = cfg;
    c.memory.shard = shard;
    c.memory.grad_accum_dtype = sums;
    return lt::trainers::model_state_bytes(c, numels, world);
  };
  const auto one = at("none", "fp32", 1);
  EXPECT_EQ(one.gradients, p);
  EXPECT_EQ(one.optimizer, 2 * p);
  EXPECT_EQ(one.comm, 0);
  const auto none = at("none", "bf16", 2);  // bf16 sums mean nothing without stage 2
  EXPECT_EQ(none.comm, p);
  EXPECT_EQ(none.gradients, 0);
  EXPECT_EQ(none.optimizer, 2 * p);
  EXPECT_EQ(at("optimizer", "fp32", 2).optimizer, p);
  const auto s2 = at("gradients", "fp32", 2), s2b = at("gradients", "bf16", 2);
  EXPECT_EQ(s2.comm, p / 2);  // this rank's chunks, 4 bytes an element
  EXPECT_EQ(s2.optimizer, p);
  EXPECT_EQ(s2b.comm, (s2.comm + 1) / 2);
  EXPECT_EQ(s2b.optimizer, s2.optimizer);
  EXPECT_EQ(s2b.gradients, s2.gradients);
}

}  // namespace
