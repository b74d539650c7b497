// The data registry and the built-in kinds' entries (their options bound to DataConfig).
#include "leantrain/data/registry.h"

#include <algorithm>
#include <stdexcept>

#include "leantrain/data/image_folder.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/registry.h"

namespace lt::data {
namespace {

using Bound = BoundOptions<DataConfig>;

OptionRule non_empty() {
  return {"not empty", [](const OptionValue& v) -> std::string {
            return std::get<std::string>(v).empty() ? "give a path" : "";
          }};
}

const OptionRule kMaskProb = rules::in_range(0, false, 1, true);

Bound fashion_options() {
  Bound b;
  b.add("path", &DataConfig::path,
        "directory holding train-/t10k-{images-idx3,labels-idx1}-ubyte[.gz] (Debian's dataset-fashion-mnist)",
        non_empty());
  return b;
}

Bound text_options() {
  Bound b;
  b.add("path", &DataConfig::path, "a text file, or a directory of them (read in name order)", non_empty())
      .add("eval_fraction", &DataConfig::eval_fraction,
           "share of the corpus, at its end, held out for evaluation; 0: no evaluation",
           rules::in_range(0, true, 1, false))
      .add("mask_prob", &DataConfig::mask_prob, "masked-token targets: share of positions masked", kMaskProb);
  b.set_default("path", std::string("/usr/share/games/fortunes"));
  return b;
}

Bound synthetic_options() {
  Bound b;
  b.add("synthetic_samples", &DataConfig::synthetic_samples,
        "training samples (eval: max(synthetic_samples / 8, 64))", rules::at_least(1))
      .add("mask_prob", &DataConfig::mask_prob, "masked-token targets: share of positions masked", kMaskProb);
  return b;
}

BoundOptions<TokenShardsConfig> shard_options() {
  using C = TokenShardsConfig;
  BoundOptions<C> b;
  b.add("train", &C::train, "training shards: a glob (\"data/fortunes_train_*.bin\"), a directory (its *.bin) or a file",
        non_empty())
      .add("eval", &C::eval, "evaluation shards, the same way; empty: no evaluation")
      .add("format", &C::format, "llm.c (256 x int32 header) or raw (headerless, nanoGPT's .bin)",
           rules::one_of({"llm.c", "raw"}))
      .add("dtype", &C::dtype, "token type: required for raw (uint16 | uint32); for llm.c the header says")
      .add("vocab_size", &C::vocab_size, "the tokenizer's vocabulary (every token is checked below it); 0: the model's",
           rules::at_least(0))
      .add("mask_id", &C::mask_id, "masked targets: the tokenizer's [MASK] id (required then)", rules::at_least(-1))
      .add("special_ids", &C::special_ids, "masked targets: ids never masked ([CLS], [SEP], [PAD], ...)",
           rules::at_least(0))
      .add("mask_prob", &C::mask_prob, "masked targets: share of positions masked", kMaskProb);
  return b;
}

// A kind whose options are one struct C with a seed member, built by make(C, contract).
template <class C, class Make>
DataKind bound_kind(std::string name, std::string doc, BoundOptions<C> bound, Make make) {
  DataKind k;
  k.name = std::move(name);
  k.doc = std::move(doc);
  k.options = bound.table();
  k.make = [bound, make](const Options& o, uint64_t seed, const InputContract& model) {
    C c = bound.read(o);
    c.seed = seed;
    return make(c, model);
  };
  return k;
}

DataKind token_shards_kind() {
  return bound_kind("token_shards",
                    "Pre-tokenized shards, memory-mapped (llm.c's format, or headerless uint16/uint32): windows of the "
                    "model's seq_len + 1 tokens within each shard, next-token or masked-token targets "
                    "(tools/prepare_text.py writes them from text files).",
                    shard_options(), make_token_shards);
}

BoundOptions<ImageFolderConfig> image_folder_options() {
  using C = ImageFolderConfig;
  BoundOptions<C> b;
  b.add("train", &C::train, "training images: a folder root/<class>/<image> of .jpg/.jpeg/.png files (torchvision ImageFolder's layout)",
        non_empty())
      .add("eval", &C::eval, "evaluation images, the same layout and classes; empty: no evaluation")
      .add("train_transform", &C::train_transform,
           "random_resized_crop (torchvision's RandomResizedCrop to the model's size) or none (the eval transform)",
           rules::one_of({"random_resized_crop", "none"}))
      .add("scale", &C::scale,
           "random_resized_crop: the range of the crop's share of the image's area, \"lo, hi\" (torchvision's scale)")
      .add("ratio", &C::ratio,
           "random_resized_crop: the range of the crop's aspect ratio width/height, \"lo, hi\", numbers or fractions "
           "a/b (torchvision's ratio)")
      .add("hflip", &C::hflip, "training: flip horizontally with probability 1/2")
      .add("resize", &C::resize,
           "eval transform: the shorter side resized to this, then the centre crop of the model's size; 0: round(size / 0.875)",
           rules::at_least(0))
      .add("mean", &C::mean,
           "per-channel mean subtracted from x/255: comma-separated numbers, one or one per channel; empty: ImageNet's "
           "(0.485, 0.456, 0.406; 1 channel: 0.449)")
      .add("std", &C::std_dev,
           "per-channel std dividing it, likewise; empty: ImageNet's (0.229, 0.224, 0.225; 1 channel: 0.226)")
      .add("on_corrupt", &C::on_corrupt,
           "a corrupt or unreadable image: error (naming the file) or skip (the next readable image takes its place; "
           "logged and counted)",
           rules::one_of({"error", "skip"}))
      .add("workers", &C::workers, "threads decoding each batch's images", rules::at_least(1));
  return b;
}

DataKind image_folder_kind() {
  return bound_kind("image_folder",
                    "JPEG and PNG images in root/<class>/<image> folders (classes: the sorted folder names), decoded "
                    "with libjpeg-turbo and libpng to the model's channels and size: torchvision's RandomResizedCrop + "
                    "flip for training, resize + centre crop for evaluation, then normalised; every random choice a "
                    "function of (seed, epoch, index).",
                    image_folder_options(), make_image_folder);
}

DataKind builtin(const std::string& name, std::string doc, Bound bound) {
  DataKind k;
  k.name = name;
  k.doc = std::move(doc);
  k.options = bound.table();
  k.make = [name, bound](const Options& o, uint64_t seed, const InputContract& model) {
    DataConfig c = bound.read(o);
    c.kind = name;
    c.seed = seed;
    return make_datasets(c, model);
  };
  return k;
}

// The built-in kinds first, registered when the registry is first used.
KindRegistry<DataKind>& registry() {
  static KindRegistry<DataKind>* r = [] {
    auto* reg = new KindRegistry<DataKind>("data");  // never destroyed: kinds outlive static teardown
    reg->add(builtin("fashion_mnist",
                     "Fashion-MNIST from IDX files: images [B,1,28,28] normalised, labels of 10 classes; "
                     "train = train-*, eval = t10k-* (the default kind).",
                     fashion_options()));
    reg->add(builtin("text",
                     "Byte-level text: non-overlapping windows of the model's seq_len + 1 bytes; next-token "
                     "or masked-token targets ([MASK] = 256), as the model's contract asks.",
                     text_options()));
    reg->add(builtin("synthetic",
                     "Generated samples, a pure function of (seed, index): token sequences following one "
                     "of 4 affine rules, or images labelled by a fixed random template, to the model's "
                     "contract.",
                     synthetic_options()));
    reg->add(token_shards_kind());
    reg->add(image_folder_kind());
    return reg;
  }();
  return *r;
}

}  // namespace

void register_data(DataKind kind) {
  if (!kind.make) throw std::invalid_argument("register_data(\"" + kind.name + "\"): give make");
  registry().add(std::move(kind));
}

const DataKind& data_kind(const std::string& name) { return registry().find(name); }

std::vector<std::string> data_kind_names() { return registry().names(); }

const std::string& default_data_kind() {
  static const std::string kind = "fashion_mnist";
  return kind;
}

DataSection resolve_data(const DataSection& section) {
  DataSection out = section;
  out.kind = section.kind.empty() ? default_data_kind() : section.kind;
  out.options = registry().resolve(out.kind, section.options);
  return out;
}

Datasets make_datasets(const DataSection& section, const InputContract& model) {
  const DataSection s = resolve_data(section);
  Datasets d = data_kind(s.kind).make(s.options, s.seed, model);
  if (!d.train) throw ConfigError("data.kind = \"" + s.kind + "\" built no training set");
  const auto have = d.train->fields();
  for (const auto& field : model.fields) {
    if (std::find(have.begin(), have.end(), field) == have.end())
      throw ConfigError("the model reads the input field \"" + field + "\", which data.kind = \"" + s.kind +
                        "\" does not give (" + d.train->describe() + ")");
  }
  d.train = first_samples(d.train, s.limit);
  return d;
}

}  // namespace lt::data
