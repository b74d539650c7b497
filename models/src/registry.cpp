// The model registry and the built-in kinds' entries: each kind's options bound to the
// members of ModelConfig it reads, its cross-key checks, its contract and its factory.
#include "leantrain/models/registry.h"

#include <limits>
#include <stdexcept>

#include <torch/torch.h>

#include "foreign_weights.h"
#include "foreign_weights_llama.h"
#include "leantrain/models/bert.h"
#include "leantrain/models/gpt.h"
#include "leantrain/models/llama.h"
#include "leantrain/models/mlp.h"
#include "leantrain/models/resnet.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/registry.h"

namespace lt::models {
namespace {

using Bound = BoundOptions<ModelConfig>;

Bound& transformer_options(Bound& b) {
  return b.add("vocab_size", &ModelConfig::vocab_size, "token ids are 0 .. vocab_size-1", rules::at_least(1))
      .add("seq_len", &ModelConfig::seq_len, "context length (learned positions)", rules::at_least(1))
      .add("n_layer", &ModelConfig::n_layer, "transformer blocks", rules::at_least(1))
      .add("n_head", &ModelConfig::n_head, "attention heads; must divide d_model", rules::at_least(1))
      .add("d_model", &ModelConfig::d_model, "width", rules::at_least(1))
      .add("d_ff", &ModelConfig::d_ff, "feed-forward width; 0 means 4 × d_model", rules::at_least(0))
      .add("dropout", &ModelConfig::dropout, "dropout probability", rules::in_range(0, true, 1, false))
      .add("attention", &ModelConfig::attention,
           "attention core: sdpa (at::scaled_dot_product_attention; LibTorch picks flash / memory-efficient / "
           "cuDNN / math, logged at startup) or plain (softmax(QK^T)V, keeps the [B,H,T,T] probabilities)",
           rules::one_of({"sdpa", "plain"}));
}

Bound& image_options(Bound& b) {
  return b.add("in_channels", &ModelConfig::in_channels, "input channels", rules::at_least(1))
      .add("image_size", &ModelConfig::image_size, "input height = width", rules::at_least(1))
      .add("num_classes", &ModelConfig::num_classes, "output classes", rules::at_least(1));
}

Bound gpt_options() {
  Bound b;
  return transformer_options(b);
}

Bound bert_options() {
  Bound b;
  transformer_options(b).add("type_vocab_size", &ModelConfig::type_vocab_size, "token types (segment A/B)",
                             rules::at_least(1));
  return b;
}

Bound resnet_options() {
  Bound b;
  b.add("depth", &ModelConfig::depth, "18 | 34 | 50 | 101 | 152, or 0 to give layers and block", rules::at_least(0))
      .add("layers", &ModelConfig::layers, "blocks per stage when depth = 0, e.g. [2, 2, 2, 2]", rules::at_least(1))
      .add("block", &ModelConfig::block, "residual block when depth = 0", rules::one_of({"basic", "bottleneck"}))
      .add("width", &ModelConfig::width, "channels of the first stage", rules::at_least(1))
      .add("stem", &ModelConfig::stem, "imagenet: 7x7/2 conv + max-pool; small: 3x3/1 conv (28x28 inputs)",
           rules::one_of({"imagenet", "small"}))
      .add("memory_format", &ModelConfig::memory_format, "layout of the convolutions' activations",
           rules::one_of({"channels_last", "contiguous"}))
      .add("bn_relu", &ModelConfig::bn_relu,
           "fused: a BatchNorm and the ReLU after it as one op in fp32 channels-last training; separate: two ops",
           rules::one_of({"fused", "separate"}));
  return image_options(b);
}

Bound mlp_options() {
  Bound b;
  image_options(b)
      .add("hidden", &ModelConfig::hidden, "hidden widths, one per block", rules::at_least(1))
      .add("dropout", &ModelConfig::dropout, "dropout probability", rules::in_range(0, true, 1, false));
  return b;
}

void check_heads(const ModelConfig& c) {
  if (c.d_model % c.n_head != 0)
    throw ConfigError("model.n_head = " + std::to_string(c.n_head) + ": must divide model.d_model = " +
                      std::to_string(c.d_model) + " (each head gets d_model / n_head features)");
}

InputContract token_contract(const ModelConfig& c, InputContract::Target target) {
  InputContract k;
  k.input = InputContract::Input::kTokens;
  k.target = target;
  k.seq_len = c.seq_len;
  k.vocab_size = c.vocab_size;
  k.seq_len_key = "model.seq_len";
  k.vocab_size_key = "model.vocab_size";
  return k;
}

InputContract image_contract(const ModelConfig& c) {
  InputContract k;
  k.input = InputContract::Input::kImages;
  k.target = InputContract::Target::kClassLabels;
  k.channels = c.in_channels;
  k.height = k.width = c.image_size;
  k.num_classes = c.num_classes;
  k.channels_key = "model.in_channels";
  k.size_key = "model.image_size";
  k.num_classes_key = "model.num_classes";
  return k;
}

// One built-in kind: its table reads into a ModelConfig with kind = name.
template <class M>
ModelKind builtin(const std::string& name, std::string doc, Bound bound, std::function<void(const ModelConfig&)> check,
                  std::function<InputContract(const ModelConfig&)> contract) {
  auto read = [name, bound](const Options& o) {
    ModelConfig c = bound.read(o);
    c.kind = name;
    return c;
  };
  ModelKind k;
  k.name = name;
  k.doc = std::move(doc);
  k.options = bound.table();
  if (check) k.check = [read, check](const Options& o) { check(read(o)); };
  k.contract = [read, contract](const Options& o) { return contract(read(o)); };
  k.build = [read](const Options& o) -> std::shared_ptr<Model> { return std::make_shared<M>(read(o)); };
  return k;
}

// The attention term of a transformer kind (attention_memory.h): causal for GPT, bidirectional for BERT.
ModelKind with_attention(ModelKind k, Bound bound, bool causal) {
  const std::string name = k.name;
  k.attention_memory = [name, bound, causal](const Options& o, const c10::Device& device, c10::ScalarType dtype,
                                             const RecomputePolicy& policy) {
    ModelConfig c = bound.read(o);
    c.kind = name;
    return transformer_attention_memory(c, causal, device, dtype, policy);
  };
  return k;
}

// Another library's weights for a built-in kind (foreign_weights.h), read from its options.
ModelKind with_foreign(ModelKind k, Bound bound, ImportedWeights (*import)(const ModelConfig&, const ForeignWeights&),
                       ExportedWeights (*exp)(const ModelConfig&, const NamedTensors&)) {
  const std::string name = k.name;
  auto read = [name, bound](const Options& o) {
    ModelConfig c = bound.read(o);
    c.kind = name;
    return c;
  };
  k.import_weights = [read, import](const Options& o, const ForeignWeights& w) { return import(read(o), w); };
  k.export_weights = [read, exp](const Options& o, const NamedTensors& t) { return exp(read(o), t); };
  return k;
}

// The llama kind (llama.h): its table binds LlamaConfig, not ModelConfig, so it is put
// together here rather than through builtin().
ModelKind llama_kind() {
  const BoundOptions<LlamaConfig>& bound = llama_options();
  auto read = [&bound](const Options& o) { return bound.read(o); };
  ModelKind k;
  k.name = "llama";
  k.doc =
      "A Llama-family decoder (Llama 3.x, Qwen2.5, Qwen3, Mistral, SmolLM2): RMSNorm, rotary positions, "
      "grouped-query attention, a SwiGLU MLP; causal language modelling, next-token targets. The keys are "
      "Hugging Face config.json's, so a config can be written from one; attention_bias and qk_norm pick "
      "Qwen2's and Qwen3's layers, family only what an export names.";
  k.options = bound.table();
  k.check = [read](const Options& o) { check_llama_config(read(o)); };
  k.contract = [read](const Options& o) {
    const LlamaConfig c = read(o);
    InputContract in;
    in.input = InputContract::Input::kTokens;
    in.target = InputContract::Target::kNextToken;
    in.seq_len = c.seq_len;
    in.vocab_size = c.vocab_size;
    in.seq_len_key = "model.seq_len";
    in.vocab_size_key = "model.vocab_size";
    return in;
  };
  k.build = [read](const Options& o) -> std::shared_ptr<Model> { return std::make_shared<Llama>(read(o)); };
  k.attention_memory = [read](const Options& o, const c10::Device& device, c10::ScalarType dtype,
                              const RecomputePolicy& policy) {
    return llama_attention_memory(read(o), device, dtype, policy);
  };
  // Hugging Face LlamaForCausalLM, Qwen2/Qwen3/MistralForCausalLM in and out (foreign_weights_llama.h).
  k.import_weights = import_llama;
  k.export_weights = export_llama;
  k.options_from_foreign = llama_options_from_foreign;
  return k;
}

// The built-in kinds first, registered when the registry is first used.
KindRegistry<ModelKind>& registry() {
  static KindRegistry<ModelKind>* r = [] {
    auto* reg = new KindRegistry<ModelKind>("model");  // never destroyed: kinds outlive static teardown
    reg->add(builtin<MLP>("mlp", "A multi-layer perceptron over flattened images (the default kind).",
                          mlp_options(), {}, image_contract));
    reg->add(with_attention(
        with_foreign(builtin<GPT>("gpt", "A GPT-2 style decoder: causal language modelling, next-token targets.",
                                  gpt_options(), check_heads,
                                  [](const ModelConfig& c) { return token_contract(c, InputContract::Target::kNextToken); }),
                     gpt_options(), import_gpt2, export_gpt2),
        gpt_options(), /*causal=*/true));
    reg->add(with_attention(
        with_foreign(builtin<Bert>("bert", "A BERT encoder with a masked-LM head: masked-token targets.", bert_options(),
                                   check_heads,
                                   [](const ModelConfig& c) { return token_contract(c, InputContract::Target::kMaskedTokens); }),
                     bert_options(), import_bert, export_bert),
        bert_options(), /*causal=*/false));
    reg->add(with_foreign(builtin<ResNet>(
                              "resnet", "A ResNet image classifier (torchvision's layout, BatchNorm, zero-initialised last norms).",
                              resnet_options(), [](const ModelConfig& c) { (void)resnet_layout(c); }, image_contract),
                          resnet_options(), import_torchvision_resnet, export_torchvision_resnet));
    reg->add(llama_kind());
    return reg;
  }();
  return *r;
}

const Bound& builtin_bound(const std::string& kind) {
  static const Bound gpt = gpt_options(), bert = bert_options(), resnet = resnet_options(), mlp = mlp_options();
  if (kind == "gpt") return gpt;
  if (kind == "bert") return bert;
  if (kind == "resnet") return resnet;
  if (kind == "mlp") return mlp;
  throw ConfigError("model.kind = \"" + kind + "\": not a built-in kind (gpt | bert | resnet | mlp)");
}

}  // namespace

const BoundOptions<LlamaConfig>& llama_options() {
  using rules::at_least;
  using rules::in_range;
  using rules::one_of;
  const double inf = std::numeric_limits<double>::infinity();
  static const BoundOptions<LlamaConfig> b = [inf] {
    BoundOptions<LlamaConfig> o;
    using C = LlamaConfig;
    o.add("vocab_size", &C::vocab_size, "token ids are 0 .. vocab_size-1", at_least(1))
        .add("hidden_size", &C::hidden_size, "width D of the residual stream", at_least(1))
        .add("intermediate_size", &C::intermediate_size, "width F of the SwiGLU MLP (gate_proj, up_proj)", at_least(1))
        .add("num_hidden_layers", &C::num_hidden_layers, "decoder blocks", at_least(1))
        .add("num_attention_heads", &C::num_attention_heads, "query heads H", at_least(1))
        .add("num_key_value_heads", &C::num_key_value_heads,
             "key/value heads K (grouped-query attention), must divide num_attention_heads; 0: H (multi-head)",
             at_least(0))
        .add("head_dim", &C::head_dim, "features per head h (even); 0: hidden_size / num_attention_heads", at_least(0))
        .add("rms_norm_eps", &C::rms_norm_eps,
             "RMSNorm epsilon (Llama 3, Mistral, SmolLM2: 1e-5; Qwen2.5: 1e-6; Hugging Face's LlamaConfig "
             "default: 1e-6)",
             in_range(0, false, 1, true))
        .add("rope_theta", &C::rope_theta, "RoPE base (Llama 3: 500000; Qwen: 1000000)", in_range(0, false, inf, false))
        .add("rope_scaling", &C::rope_scaling,
             "RoPE scaling of the inverse frequencies: none, or llama3 (Llama 3.1 / 3.2, the rope_* factors below)",
             one_of({"none", "llama3"}))
        .add("rope_factor", &C::rope_factor, "llama3 scaling: factor", in_range(0, false, inf, false))
        .add("rope_low_freq_factor", &C::rope_low_freq_factor, "llama3 scaling: low_freq_factor",
             in_range(0, false, inf, false))
        .add("rope_high_freq_factor", &C::rope_high_freq_factor, "llama3 scaling: high_freq_factor (> low_freq_factor)",
             in_range(0, false, inf, false))
        .add("rope_original_max_position_embeddings", &C::rope_original_max_position_embeddings,
             "llama3 scaling: original_max_position_embeddings", at_least(1))
        .add("max_position_embeddings", &C::max_position_embeddings, "the longest context the model is meant for",
             at_least(1))
        .add("seq_len", &C::seq_len, "training context length (the data's block length), <= max_position_embeddings",
             at_least(1))
        .add("tie_word_embeddings", &C::tie_word_embeddings, "the output head is embed_tokens.weight (no lm_head)")
        .add("attention_bias", &C::attention_bias, "biases on q_proj, k_proj, v_proj (Qwen2; o_proj never has one)")
        .add("qk_norm", &C::qk_norm, "RMSNorm over head_dim on q and k before RoPE (Qwen3)")
        .add("dropout", &C::dropout, "dropout on the attention probabilities and both residual branches (training)",
             in_range(0, true, 1, false))
        .add("attention", &C::attention,
             "attention core: sdpa (at::scaled_dot_product_attention with enable_gqa, the kernel logged at startup) or "
             "plain (softmax(QK^T)V with k/v repeated, keeps the [B,H,T,T] probabilities)",
             one_of({"sdpa", "plain"}))
        .add("family", &C::family,
             "the architecture an export names (architectures, model_type); no effect on the layers",
             one_of({"llama", "qwen2", "qwen3", "mistral"}))
        .add("hidden_act", &C::hidden_act, "the MLP's activation (config.json's hidden_act)", one_of({"silu"}));
    return o;
  }();
  return b;
}

void register_model(ModelKind kind) {
  if (!kind.contract || !kind.build)
    throw std::invalid_argument("register_model(\"" + kind.name + "\"): give both contract and build");
  registry().add(std::move(kind));
}

const ModelKind& model_kind(const std::string& name) { return registry().find(name); }

std::vector<std::string> model_kind_names() { return registry().names(); }

const std::string& default_model_kind() {
  static const std::string kind = "mlp";
  return kind;
}

ModelSection resolve_model(const ModelSection& section) {
  ModelSection out;
  out.kind = section.kind.empty() ? default_model_kind() : section.kind;
  out.options = registry().resolve(out.kind, section.options);
  const ModelKind& k = model_kind(out.kind);
  if (k.check) k.check(out.options);
  return out;
}

InputContract model_contract(const ModelSection& section) {
  const ModelSection s = resolve_model(section);
  return model_kind(s.kind).contract(s.options);
}

std::shared_ptr<Model> build_model(const ModelSection& section) {
  const ModelSection s = resolve_model(section);
  return model_kind(s.kind).build(s.options);
}

AttentionMemory attention_memory(const ModelSection& section, const c10::Device& device, c10::ScalarType dtype,
                                 const RecomputePolicy& policy) {
  const ModelSection s = resolve_model(section);
  const ModelKind& k = model_kind(s.kind);
  return k.attention_memory ? k.attention_memory(s.options, device, dtype, policy) : AttentionMemory{};
}

ModelSection builtin_model_section(const ModelConfig& cfg) {
  return ModelSection{cfg.kind, builtin_bound(cfg.kind).write(cfg)};
}

InputContract model_contract(const ModelConfig& cfg) { return model_contract(builtin_model_section(cfg)); }

void check_model_config(const ModelConfig& cfg) { (void)resolve_model(builtin_model_section(cfg)); }

std::shared_ptr<Model> build_model(const ModelConfig& cfg) { return build_model(builtin_model_section(cfg)); }

}  // namespace lt::models
