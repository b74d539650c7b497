#include "tiny_vit.h"

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/options.h"

namespace example {

EncoderBlockImpl::EncoderBlockImpl(int64_t dim, int64_t heads) : heads_(heads) {
  ln1_ = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  qkv_ = register_module("qkv", torch::nn::Linear(dim, 3 * dim));
  proj_ = register_module("proj", torch::nn::Linear(dim, dim));
  ln2_ = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})));
  fc_ = register_module("fc", torch::nn::Linear(dim, 4 * dim));
  out_ = register_module("out", torch::nn::Linear(4 * dim, dim));
}

torch::Tensor EncoderBlockImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), D = x.size(2), hd = D / heads_;
  auto qkv = qkv_->forward(ln1_->forward(x)).view({B, T, 3, heads_, hd}).permute({2, 0, 3, 1, 4});
  auto att = torch::softmax(torch::matmul(qkv[0], qkv[1].transpose(-2, -1)) / std::sqrt(static_cast<double>(hd)), -1);
  auto y = torch::matmul(att, qkv[2]).transpose(1, 2).reshape({B, T, D});
  auto h = x + proj_->forward(y);
  return h + out_->forward(torch::gelu(fc_->forward(ln2_->forward(h))));
}

TinyVit::TinyVit(const TinyVitOptions& o) {
  patches_ = register_module(
      "patches", torch::nn::Conv2d(torch::nn::Conv2dOptions(o.channels, o.dim, o.patch).stride(o.patch)));
  const int64_t n = (o.image / o.patch) * (o.image / o.patch);
  pos_ = register_parameter("pos", torch::randn({1, n, o.dim}) * 0.02);
  // Registered as leantrain blocks: named blocks.<i>.*, and the unit of recompute.
  for (int64_t i = 0; i < o.depth; ++i) add_block("blocks", std::make_shared<EncoderBlockImpl>(o.dim, o.heads));
  ln_ = register_module("ln", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.dim})));
  head_ = register_module("head", torch::nn::Linear(o.dim, o.classes));
}

torch::Tensor TinyVit::forward(const torch::Tensor& images) {
  auto x = patches_->forward(images).flatten(2).transpose(1, 2) + pos_;  // [B, patches, dim]
  for (size_t i = 0; i < blocks().size(); ++i) x = run_block(i, x);     // recomputed per policy
  return head_->forward(ln_->forward(x).mean(1));
}

namespace {

// tiny_vit's options, bound to TinyVitOptions (whose initializers are the defaults).
lt::BoundOptions<TinyVitOptions> vit_options() {
  using O = TinyVitOptions;
  lt::BoundOptions<O> b;
  b.add("image", &O::image, "input height = width", lt::rules::at_least(1))
      .add("patch", &O::patch, "patch side; must divide image", lt::rules::at_least(1))
      .add("channels", &O::channels, "input channels", lt::rules::at_least(1))
      .add("classes", &O::classes, "output classes", lt::rules::at_least(2))
      .add("dim", &O::dim, "width", lt::rules::at_least(1))
      .add("heads", &O::heads, "attention heads; must divide dim", lt::rules::at_least(1))
      .add("depth", &O::depth, "encoder blocks", lt::rules::at_least(1));
  return b;
}

}  // namespace

lt::models::ModelKind tiny_vit_kind() {
  const auto vit = vit_options();
  lt::models::ModelKind kind;
  kind.name = "tiny_vit";
  kind.doc = "A small vision transformer (examples/custom_model/tiny_vit.h).";
  kind.options = vit.table();
  kind.check = [vit](const lt::Options& o) {
    const auto v = vit.read(o);
    if (v.image % v.patch != 0) throw lt::ConfigError("model.patch = " + std::to_string(v.patch) + ": must divide model.image");
    if (v.dim % v.heads != 0) throw lt::ConfigError("model.heads = " + std::to_string(v.heads) + ": must divide model.dim");
  };
  // images [B, channels, image, image] -> labels of `classes` classes
  kind.contract = [](const lt::Options& o) { return lt::InputContract::images(o, "channels", "image", "classes"); };
  kind.build = [vit](const lt::Options& o) { return std::make_shared<TinyVit>(vit.read(o)); };
  return kind;
}

}  // namespace example
