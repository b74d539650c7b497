// Mixed precision: the loss scaler against PyTorch's GradScaler, skipped steps, autocast.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/precision.h"
#include "leantrain/trainers/precision.h"

namespace {

using lt::trainers::LossScaler;

TEST(LossScaler, MatchesPyTorchGradScalerStepByStep) {
  std::ifstream in(LEANTRAIN_GRADSCALER_JSON);
  ASSERT_TRUE(in) << "missing " << LEANTRAIN_GRADSCALER_JSON << " (made by tests/scripts/gradscaler_reference.py)";
  const auto ref = nlohmann::json::parse(in);
  lt::PrecisionConfig pc;
  pc.init_scale = ref["config"]["init_scale"];
  pc.growth_factor = ref["config"]["growth_factor"];
  pc.backoff_factor = ref["config"]["backoff_factor"];
  pc.growth_interval = ref["config"]["growth_interval"];
  LossScaler scaler(pc, true, torch::kCPU);
  lt::comm::LocalCommunicator comm;
  auto p = torch::full({4}, 0.5).requires_grad_(true);
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  auto w = torch::tensor(ref["weights"].get<std::vector<float>>());
  int i = 0, skipped = 0;
  for (const auto& s : ref["steps"]) {
    SCOPED_TRACE("step " + std::to_string(i));
    opt.zero_grad();
    auto loss = (p * w).sum() * (1.0 + i);
    scaler.scale(loss).backward();
    if (s["overflow"].get<int>()) p.mutable_grad()[1] = std::numeric_limits<float>::infinity();
    EXPECT_EQ(scaler.scale_value(), s["scale_before"].get<double>());
    const bool stepped = lt::trainers::apply_update(opt, scaler, {p}, 0.0, comm);
    EXPECT_EQ(stepped, s["overflow"].get<int>() == 0);
    skipped += !stepped;
    auto pv = s["param"].get<std::vector<double>>();
    for (int j = 0; j < 4; ++j) {
      const auto& g = s["grad"][j];  // null where PyTorch's gradient was non-finite
      if (g.is_null()) EXPECT_FALSE(std::isfinite(p.grad()[j].item<float>())) << j;
      else EXPECT_EQ(p.grad()[j].item<float>(), static_cast<float>(g.get<double>())) << j;
      EXPECT_EQ(p[j].item<float>(), static_cast<float>(pv[j])) << j;
    }
    EXPECT_EQ(scaler.scale_value(), s["scale_after"].get<double>());
    EXPECT_EQ(scaler.growth_tracker(), s["growth_tracker"].get<int64_t>());
    ++i;
  }
  EXPECT_EQ(i, 20);
  EXPECT_EQ(skipped, 4);
}

TEST(LossScaler, OverflowStepLeavesWeightsAndOptimizerStateUnchanged) {
  torch::manual_seed(0);
  torch::nn::Linear lin(8, 4);
  auto params = lin->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(1e-2));
  lt::PrecisionConfig pc;
  LossScaler scaler(pc, true, torch::kCPU);
  lt::comm::LocalCommunicator comm;
  auto x = torch::randn({16, 8});
  auto one_step = [&](bool overflow) {
    opt.zero_grad();
    scaler.scale(lin->forward(x).pow(2).mean()).backward();
    if (overflow) params[0].mutable_grad()[0][0] = std::numeric_limits<float>::quiet_NaN();
    return lt::trainers::apply_update(opt, scaler, params, 1.0, comm);
  };
  ASSERT_TRUE(one_step(false));  // creates the AdamW state
  std::vector<torch::Tensor> w_before, m_before, v_before;
  for (auto& p : params) {
    w_before.push_back(p.detach().clone());
    auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    m_before.push_back(st.exp_avg().clone());
    v_before.push_back(st.exp_avg_sq().clone());
    ASSERT_EQ(st.step(), 1);
  }
  const double scale = scaler.scale_value();
  EXPECT_FALSE(one_step(true));
  EXPECT_EQ(scaler.scale_value(), scale * 0.5);
  for (size_t i = 0; i < params.size(); ++i) {
    auto& st = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(params[i].unsafeGetTensorImpl()));
    EXPECT_TRUE(torch::equal(params[i], w_before[i]));
    EXPECT_TRUE(torch::equal(st.exp_avg(), m_before[i]));
    EXPECT_TRUE(torch::equal(st.exp_avg_sq(), v_before[i]));
    EXPECT_EQ(st.step(), 1);
  }
}

TEST(LossScaler, DisabledIsIdentity) {
  LossScaler scaler(lt::PrecisionConfig{}, false, torch::kCPU);
  auto l = torch::tensor(3.0);
  EXPECT_TRUE(torch::equal(scaler.scale(l), l));
  EXPECT_EQ(scaler.scale_value(), 1.0);
}

TEST(Autocast, GuardCastsMatmulAndRestores) {
  auto a = torch::randn({4, 4});
  {
    lt::trainers::AutocastGuard g("bf16", torch::kCPU);
    EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kFloat);
  {
    lt::trainers::AutocastGuard g("fp32", torch::kCPU);
    EXPECT_EQ(torch::matmul(a, a).scalar_type(), torch::kFloat);
  }
  EXPECT_NO_THROW(lt::trainers::check_precision_supported("bf16", torch::kCPU));
}

// precision.mode's one mapping to a dtype (runtime/precision.h), and its text back.
TEST(Autocast, PrecisionParsesTheThreeModesAndNamesTheKeyOtherwise) {
  EXPECT_EQ(lt::compute_dtype(lt::parse_precision("fp32")), torch::kFloat);
  EXPECT_EQ(lt::compute_dtype(lt::parse_precision("bf16")), torch::kBFloat16);
  EXPECT_EQ(lt::compute_dtype(lt::parse_precision("fp16")), torch::kHalf);
  for (const char* mode : {"fp32", "bf16", "fp16"}) EXPECT_STREQ(lt::to_string(lt::parse_precision(mode)), mode);
  try {
    lt::parse_precision("half");
    FAIL() << "'half' was accepted";
  } catch (const lt::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("precision.mode = 'half'"), std::string::npos) << e.what();
  }
}

// A mode the device cannot run is a config error at startup that names the key, the device
// and what to use instead (here: a CUDA device where none can run, which is what this CPU-only
// machine has; the same path reports a CPU whose LibTorch lacks fp16 matmuls).
TEST(Autocast, UnrunnableModeIsAConfigErrorNamingTheKey) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device runs every mode";
  for (const char* mode : {"fp16", "bf16"}) {
    try {
      lt::trainers::check_precision_supported(mode, torch::Device(torch::kCUDA, 0));
      FAIL() << mode << " was accepted on a CUDA device that cannot run";
    } catch (const lt::ConfigError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(std::string("precision.mode = '") + mode + "': this LibTorch cannot run " + mode +
                         " matmuls on cuda:0"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(std::string(mode) == "fp16" ? "use bf16 or fp32" : "use fp32"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << "one line: " << msg;
    }
  }
  EXPECT_NO_THROW(lt::trainers::check_precision_supported("fp32", torch::Device(torch::kCUDA, 0)));
}

}  // namespace
