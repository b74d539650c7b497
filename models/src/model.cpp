// The Model base, count_parameters, compute_loss, and the MLP.
#include "leantrain/models/model.h"

#include <sstream>
#include <unordered_set>

#include <torch/torch.h>

#include "leantrain/recompute/recompute.h"
#include "leantrain/recompute/lm_loss.h"
#include "leantrain/models/mlp.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {

// The recompute layer's pieces (in_backward, dropout, packed inputs, the LM losses).
using namespace lt::recompute;

const char* task_name(Task task) {
  switch (task) {
    case Task::kClassify: return "classify";
    case Task::kCausalLM: return "causal_lm";
    case Task::kMaskedLM: return "masked_lm";
  }
  return "unknown";
}

torch::nn::ModuleList Model::block_list(const std::string& name) {
  auto it = block_lists_.find(name);
  if (it != block_lists_.end()) return it->second;
  auto list = register_module(name, torch::nn::ModuleList());
  block_lists_.emplace(name, list);
  return list;
}

torch::Tensor Model::run_block(size_t i, const torch::Tensor& x) {
  TORCH_CHECK(i < blocks_.size(), "run_block: block ", i, " of ", blocks_.size());
  if (runner_) return runner_(i, *blocks_[i], x);
  return blocks_[i]->forward(x);
}

void Model::mark_cheap(const std::string& name, const CheapRegion& region) { cheap_regions_.emplace_back(name, region); }

std::vector<std::string> Model::cheap_region_names() const {
  std::vector<std::string> names;
  for (const auto& r : cheap_regions_) names.push_back(r.first);
  return names;
}

std::string Model::compute_note(const c10::Device& /*device*/, c10::ScalarType /*dtype*/) const { return {}; }

int64_t count_parameters(const torch::nn::Module& m) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const auto& p : m.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

torch::Tensor Model::forward_loss(const torch::Tensor& input, const torch::Tensor& target) {
  return compute_loss(task(), forward(input).to(torch::kFloat), target);
}

torch::Tensor Model::forward_with(const torch::Tensor& input, const TensorMap& /*fields*/) { return forward(input); }

torch::Tensor Model::forward_loss_with(const torch::Tensor& input, const torch::Tensor& target,
                                       const TensorMap& /*fields*/) {
  return forward_loss(input, target);
}

int64_t Model::loss_chunk_tokens(int64_t vocab) const {
  if (loss_chunk_tokens_ == 0 || !is_training() || !torch::GradMode::is_enabled()) return 0;
  if (loss_chunk_tokens_ > 0) return loss_chunk_tokens_;
  return lm_loss_chunk_tokens(vocab);
}

int64_t Model::fused_loss_chunk_tokens(int64_t vocab, int64_t dim, c10::DeviceType device) const {
  if (!fused_loss_ || !is_training() || !fused_lm_loss_applies(device)) return 0;
  return loss_chunk_tokens_ > 0 ? loss_chunk_tokens_ : fused_lm_loss_chunk_tokens(vocab, dim);
}

torch::Tensor compute_loss(Task task, const torch::Tensor& logits, const torch::Tensor& target) {
  if (task == Task::kClassify) {
    TORCH_CHECK(logits.dim() == 2, "compute_loss(classify): logits must be [B,K], got ",
                logits.sizes());
    return torch::nn::functional::cross_entropy(logits, target);
  }
  TORCH_CHECK(logits.dim() >= 2, "compute_loss(lm): logits must be [B,T,V], got ",
              logits.sizes());
  const int64_t v = logits.size(-1);
  TORCH_CHECK(target.numel() * v == logits.numel(), "compute_loss(lm): target ", target.sizes(),
              " does not match logits ", logits.sizes());
  return torch::nn::functional::cross_entropy(
      logits.reshape({-1, v}), target.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex));
}

// ---- MLP ----

MLPBlockImpl::MLPBlockImpl(int64_t in, int64_t out, double dropout) : dropout_(dropout) {
  fc = register_module("fc", torch::nn::Linear(in, out));
}

torch::Tensor MLPBlockImpl::forward(const torch::Tensor& x) {
  auto y = torch::relu(fc(x));
  if (dropout_ > 0.0) y = lt::recompute::dropout(y, dropout_, is_training());
  return y;
}

MLP::MLP(const lt::models::ModelConfig& cfg)
    : in_features_(cfg.in_channels * cfg.image_size * cfg.image_size) {
  int64_t in = in_features_;
  for (int64_t h : cfg.hidden) {
    add_block("blocks", std::make_shared<MLPBlockImpl>(in, h, cfg.dropout));
    in = h;
  }
  head = register_module("head", torch::nn::Linear(in, cfg.num_classes));
}

torch::Tensor MLP::forward(const torch::Tensor& input) {
  TORCH_CHECK(input.dim() >= 1 && input.numel() == input.size(0) * in_features_,
              "MLP: expected ", in_features_, " features per sample, got input ", input.sizes());
  auto x = input.reshape({input.size(0), in_features_});
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);
  return head(x);
}

}  // namespace lt::models
