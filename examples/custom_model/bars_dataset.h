#pragma once
// A user's dataset: 16x16 grey images of a bar in one of four orientations (the label),
// at a random offset, under noise. Each sample is a pure function of (seed, index), which is
// all leantrain asks of a dataset: then any rank can build any sample, and a resumed run sees
// exactly the samples of an uninterrupted one.
#include <cstdint>
#include <string>

#include "leantrain/data/dataset.h"
#include "leantrain/data/registry.h"

namespace example {

class BarsDataset : public lt::data::Dataset {
 public:
  BarsDataset(int64_t size, uint64_t seed, int64_t image = 16) : size_(size), seed_(seed), image_(image) {}
  int64_t size() const override { return size_; }
  /// input float [B, 1, image, image], target int64 [B] in 0..3.
  lt::data::Batch get(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::string describe() const override;

 private:
  int64_t size_;
  uint64_t seed_;
  int64_t image_;
};

/// The kind: [data] kind = "bars", with train_samples and eval_samples; it serves a model that
/// takes square grey images with labels of 4 classes, and refuses any other by a config error.
lt::data::DataKind bars_kind();

}  // namespace example
