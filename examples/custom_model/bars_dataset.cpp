#include "bars_dataset.h"

#include <random>
#include <stdexcept>

#include "leantrain/data/sampling.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/options.h"

namespace example {

lt::data::Batch BarsDataset::get(const std::vector<int64_t>& indices, int64_t /*epoch*/) const {
  const auto B = static_cast<int64_t>(indices.size()), S = image_;
  auto images = torch::empty({B, 1, S, S});
  auto labels = torch::empty({B}, torch::kLong);
  auto img = images.accessor<float, 4>();
  auto lab = labels.accessor<int64_t, 1>();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t i = indices[static_cast<size_t>(b)];
    if (i < 0 || i >= size_) throw std::out_of_range("BarsDataset: index " + std::to_string(i) + " of " + describe());
    std::mt19937_64 rng(lt::data::mix_seed({seed_, static_cast<uint64_t>(i)}));
    std::normal_distribution<float> noise(0.0f, 0.5f);
    const int64_t label = static_cast<int64_t>(rng() % 4), offset = static_cast<int64_t>(rng() % S);
    lab[b] = label;
    for (int64_t y = 0; y < S; ++y)
      for (int64_t x = 0; x < S; ++x) {
        const bool on = label == 0   ? y == offset                       // horizontal
                        : label == 1 ? x == offset                       // vertical
                        : label == 2 ? (x - y + S) % S == offset         // diagonal
                                     : (x + y) % S == offset;            // anti-diagonal
        img[b][0][y][x] = (on ? 1.5f : 0.0f) + noise(rng);
      }
  }
  return {images, labels, 0};
}

std::string BarsDataset::describe() const {
  return "bars: " + std::to_string(size_) + " images 1x" + std::to_string(image_) + "x" + std::to_string(image_) +
         ", 4 orientations";
}

namespace {

struct BarsOptions {
  int64_t train_samples = 4096, eval_samples = 512;
};

}  // namespace

lt::data::DataKind bars_kind() {
  lt::BoundOptions<BarsOptions> bars;
  bars.add("train_samples", &BarsOptions::train_samples, "training samples", lt::rules::at_least(1))
      .add("eval_samples", &BarsOptions::eval_samples, "evaluation samples", lt::rules::at_least(1));
  lt::data::DataKind kind;
  kind.name = "bars";
  kind.doc = "Grey images of a bar in one of four orientations (examples/custom_model/bars_dataset.h).";
  kind.options = bars.table();
  kind.make = [bars](const lt::Options& o, uint64_t seed, const lt::InputContract& model) {
    const auto b = bars.read(o);
    if (model.input != lt::InputContract::Input::kImages || model.channels != 1 || model.height != model.width ||
        model.num_classes != 4)
      throw lt::ConfigError("data.kind = \"bars\" gives images [B,1,S,S] with labels of 4 classes; the model takes " +
                            model.describe());
    return lt::data::Datasets{std::make_shared<BarsDataset>(b.train_samples, seed, model.height),
                              std::make_shared<BarsDataset>(b.eval_samples, seed + 1, model.height)};
  };
  return kind;
}

}  // namespace example
