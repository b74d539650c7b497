#include "leantrain/optim/optimizer.h"
#include "leantrain/optim/quantized_state.h"
#include "leantrain/optim/sharded_optimizer.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

namespace lt::optim {

namespace {
// The loss of an optimizer's closure, evaluated with gradients on (none without a closure).
torch::Tensor closure_loss(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}
}  // namespace

torch::Tensor FusedAdamW::step(LossClosure closure) {
  auto loss = closure_loss(closure);
  step_scaled({});
  return loss;
}

void FusedAdamW::step_scaled(const torch::Tensor& grad_scale) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    if (options.amsgrad()) throw std::logic_error("FusedAdamW: amsgrad is not supported");
    std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, steps;
    // The kernel reads each parameter's step count from a tensor (torch.optim keeps one per
    // parameter); parameters at the same count share one.
    std::map<int64_t, torch::Tensor> step_of;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedAdamW does not support sparse gradients");
      auto it = state_.find(p.unsafeGetTensorImpl());
      if (it == state_.end()) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(0);
        st->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        it = state_.emplace(p.unsafeGetTensorImpl(), std::move(st)).first;
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      st.step(st.step() + 1);
      auto& count = step_of[st.step()];
      if (!count.defined())
        count = torch::full({}, static_cast<double>(st.step()), torch::TensorOptions().dtype(torch::kFloat).device(p.device()));
      params.push_back(p);
      grads.push_back(p.grad());
      exp_avgs.push_back(st.exp_avg());
      exp_avg_sqs.push_back(st.exp_avg_sq());
      steps.push_back(count);
    }
    if (params.empty()) continue;
    const auto [beta1, beta2] = options.betas();
    std::optional<at::Tensor> scale;
    if (grad_scale.defined()) scale = grad_scale;
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, /*max_exp_avg_sqs=*/{}, steps, options.lr(), beta1, beta2,
                      options.weight_decay(), options.eps(), /*amsgrad=*/false, /*maximize=*/false, scale,
                      /*found_inf=*/std::nullopt);
  }
}

std::vector<torch::Tensor> ScaledStep::update_gradients(const std::vector<torch::Tensor>& params) const {
  std::vector<torch::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  return grads;
}

torch::Tensor FusedSGD::step(LossClosure closure) {
  auto loss = closure_loss(closure);
  step_scaled({});
  return loss;
}

void FusedSGD::step_scaled(const torch::Tensor& grad_scale) {
  torch::NoGradGuard no_grad;
  std::optional<at::Tensor> scale;
  if (grad_scale.defined()) scale = grad_scale;
  for (auto& group : param_groups_) {
    auto& o = static_cast<torch::optim::SGDOptions&>(group.options());
    // The kernel's is_first_step (the buffer becomes the gradient) holds for a whole call, so
    // parameters without a momentum buffer yet (their first gradient) go in a call of their own.
    std::vector<torch::Tensor> params[2], grads[2], bufs[2];
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      TORCH_CHECK(!p.grad().is_sparse(), "FusedSGD does not support sparse gradients");
      int first = 0;
      if (o.momentum() != 0) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) {
          auto st = std::make_unique<torch::optim::SGDParamState>();
          st->momentum_buffer(torch::empty_like(p.grad(), torch::MemoryFormat::Preserve));
          it = state_.emplace(p.unsafeGetTensorImpl(), std::move(st)).first;
          first = 1;
        }
        bufs[first].push_back(static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
      }
      params[first].push_back(p);
      grads[first].push_back(p.grad());
    }
    for (int first = 0; first < 2; ++first) {
      if (params[first].empty()) continue;
      at::_fused_sgd_(params[first], grads[first], bufs[first], o.weight_decay(), o.momentum(), o.lr(), o.dampening(),
                      o.nesterov(), /*maximize=*/false, /*is_first_step=*/first == 1, scale, /*found_inf=*/std::nullopt);
    }
  }
}

std::vector<torch::optim::OptimizerParamGroup> optimizer_groups(const TrainConfig& t, torch::nn::Module& model) {
  // Weight decay on matrices and conv kernels only, not on biases and norm scales (the
  // GPT-2/BERT convention every peer recipe follows).
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  for (const double wd : {t.weight_decay, 0.0}) {
    std::unique_ptr<torch::optim::OptimizerOptions> o;
    if (t.optimizer == "adamw")
      o = std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(wd));
    else
      o = std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(wd));
    groups.emplace_back(groups.empty() ? decay : no_decay, std::move(o));
  }
  return groups;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& t, torch::nn::Module& model) {
  if (t.optimizer == "adamw") return std::make_unique<FusedAdamW>(optimizer_groups(t, model), torch::optim::AdamWOptions(t.lr));
  return std::make_unique<FusedSGD>(optimizer_groups(t, model), torch::optim::SGDOptions(t.lr));
}

int64_t optimizer_state_bytes(const TrainConfig& t, int64_t param_bytes) {
  if (t.optimizer == "adamw") return 2 * param_bytes;
  return t.momentum != 0 ? param_bytes : 0;
}

int64_t fp32_bytes(const std::vector<int64_t>& numels) {
  int64_t bytes = 0;
  for (auto n : numels) bytes += 4 * n;
  return bytes;
}

int64_t optimizer_state_bytes(const Config& cfg, const std::vector<int64_t>& numels, int world) {
  int64_t bytes = optimizer_state_bytes(cfg.train, fp32_bytes(numels));
  if (cfg.memory.optimizer_state == "int8" && cfg.train.optimizer == "adamw") {
    // 8-bit moments: a byte per element per moment plus a float scale per block; tensors
    // under kMin8bitNumel elements keep FP32 moments (8 bytes an element).
    bytes = 0;
    for (auto n : numels)
      bytes += n >= kMin8bitNumel ? 2 * (n + 4 * ((n + kQuantBlock - 1) / kQuantBlock)) : 8 * n;
  }
  if (cfg.memory.shard != "none" && world > 1) bytes = (bytes + world - 1) / world;
  return bytes;
}

std::vector<int64_t> parameter_numels(torch::nn::Module& model) {
  std::vector<int64_t> n;
  for (const auto& p : model.parameters()) n.push_back(p.numel());
  return n;
}

ModelStateBytes model_state_bytes(const Config& cfg, const std::vector<int64_t>& numels, int world) {
  const int64_t param_bytes = fp32_bytes(numels);
  ModelStateBytes b;
  b.optimizer = optimizer_state_bytes(cfg, numels, world);
  b.gradients = param_bytes;
  if (world > 1) {
    // The buckets; the gradients live in them from the first backward on (Note [Gradients as
    // bucket views] in comm/src/grad_sync.cpp).
    b.comm = param_bytes;
    b.gradients = 0;
    if (cfg.memory.shard == "gradients") {
      // The chunk accumulators, and live gradients of about three buckets: the one backward is
      // filling and the two in flight (Note [Sharded model state]).
      b.comm = (param_bytes + world - 1) / world;
      if (cfg.memory.grad_accum_dtype == "bf16") b.comm = (b.comm + 1) / 2;  // 2 bytes an element
      b.gradients = std::min(param_bytes, static_cast<int64_t>(3 * cfg.comm.bucket_mb * 1048576.0));
    }
  }
  return b;
}

int64_t optimizer_state_allocated_bytes(torch::optim::Optimizer& optimizer) {
  if (auto* s = dynamic_cast<const ShardedOptimizer*>(&optimizer)) return s->state_bytes();
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& x) {
    if (x.defined()) bytes += static_cast<int64_t>(x.nbytes());
  };
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      add(m->momentum_buffer());
    }
  }
  return bytes;
}

}  // namespace lt::optim
