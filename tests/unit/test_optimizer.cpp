// Note [Fused update]: FusedAdamW (train.optimizer = adamw) allocates no temporaries, and
// through apply_update it matches PyTorch's AdamW(fused=True) + GradScaler + clip_grad_norm_,
// step by step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "leantrain/comm/communicator.h"
#include "leantrain/optim/optimizer.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/precision.h"

namespace {

// The bytes an update of a 16 MiB parameter allocates for a moment, its moments allocated
// before (LibTorch's unfused AdamW: two temporaries the size of the parameter).
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

TEST(FusedAdamW, NoTemporaries) {
  EXPECT_LE(update_extra_bytes<lt::optim::FusedAdamW>(), 64 << 10);
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
    auto optimizer = lt::optim::make_optimizer(t, holder);
    auto& opt = *optimizer;
    ASSERT_NE(dynamic_cast<lt::optim::ScaledStep*>(&opt), nullptr);
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
    return lt::optim::model_state_bytes(c, numels, world);
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
