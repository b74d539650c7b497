// The Model base, build_model, count_parameters, compute_loss, and the MLP.
#include "leantrain/models/model.h"

#include <sstream>
#include <unordered_set>

#include <torch/torch.h>

#include "leantrain/models/activation_checkpoint.h"
#include "leantrain/models/bert.h"
#include "leantrain/models/gpt.h"
#include "leantrain/models/lm_loss.h"
#include "leantrain/models/mlp.h"
#include "leantrain/models/resnet.h"
#include "leantrain/runtime/errors.h"

namespace lt::models {

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

namespace {

[[noreturn]] void fail(const std::string& key, const std::string& value, const std::string& why) {
  throw lt::ConfigError("model." + key + " = " + value + ": " + why);
}

void require_positive(const std::string& key, int64_t v) {
  if (v < 1) fail(key, std::to_string(v), "must be >= 1");
}

void require_dropout(double p) {
  if (!(p >= 0.0 && p < 1.0)) {
    std::ostringstream s;
    s << p;
    fail("dropout", s.str(), "must be in [0, 1)");
  }
}

void check_transformer(const lt::ModelConfig& c) {
  require_positive("vocab_size", c.vocab_size);
  require_positive("seq_len", c.seq_len);
  require_positive("n_layer", c.n_layer);
  require_positive("n_head", c.n_head);
  require_positive("d_model", c.d_model);
  if (c.d_model % c.n_head != 0) {
    fail("n_head", std::to_string(c.n_head),
         "must divide model.d_model = " + std::to_string(c.d_model) +
             " (each head gets d_model / n_head features)");
  }
  if (c.d_ff < 0) fail("d_ff", std::to_string(c.d_ff), "must be >= 1, or 0 for 4 * d_model");
  require_dropout(c.dropout);
}

void check_images(const lt::ModelConfig& c) {
  require_positive("in_channels", c.in_channels);
  require_positive("image_size", c.image_size);
  require_positive("num_classes", c.num_classes);
}

}  // namespace

void check_model_config(const lt::ModelConfig& c) {
  if (c.kind == "gpt") {
    check_transformer(c);
  } else if (c.kind == "bert") {
    check_transformer(c);
    require_positive("type_vocab_size", c.type_vocab_size);
  } else if (c.kind == "resnet") {
    check_images(c);
    (void)resnet_layout(c);
    require_positive("width", c.width);
    if (c.stem != "imagenet" && c.stem != "small") {
      fail("stem", "\"" + c.stem + "\"", "must be \"imagenet\" or \"small\"");
    }
  } else if (c.kind == "mlp") {
    check_images(c);
    for (size_t i = 0; i < c.hidden.size(); ++i) {
      if (c.hidden[i] < 1) {
        fail("hidden", "[... " + std::to_string(c.hidden[i]) + " ...]",
             "every hidden width must be >= 1 (entry " + std::to_string(i) + ")");
      }
    }
    require_dropout(c.dropout);
  } else {
    fail("kind", "\"" + c.kind + "\"", "must be one of gpt, bert, resnet, mlp");
  }
}

std::shared_ptr<Model> build_model(const lt::ModelConfig& cfg) {
  check_model_config(cfg);
  if (cfg.kind == "gpt") return std::make_shared<GPT>(cfg);
  if (cfg.kind == "bert") return std::make_shared<Bert>(cfg);
  if (cfg.kind == "resnet") return std::make_shared<ResNet>(cfg);
  return std::make_shared<MLP>(cfg);
}

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

int64_t Model::loss_chunk_tokens(int64_t vocab) const {
  if (loss_chunk_tokens_ == 0 || !is_training() || !torch::GradMode::is_enabled()) return 0;
  if (loss_chunk_tokens_ > 0) return loss_chunk_tokens_;
  return lm_loss_chunk_tokens(vocab);
}

int64_t Model::fused_loss_chunk_tokens(int64_t vocab, c10::DeviceType device) const {
  if (!fused_loss_ || !is_training() || !fused_lm_loss_applies(device)) return 0;
  return loss_chunk_tokens_ > 0 ? loss_chunk_tokens_ : lm_loss_chunk_tokens(vocab);
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
  if (dropout_ > 0.0) y = lt::models::dropout(y, dropout_, is_training());
  return y;
}

MLP::MLP(const lt::ModelConfig& cfg)
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
