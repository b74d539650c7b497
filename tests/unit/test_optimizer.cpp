// Note [Chunked AdamW]: leantrain's AdamW step equals LibTorch's bit for bit, with bounded
// temporaries.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/optimizer.h"

namespace {

std::vector<torch::Tensor> make_params() {
  torch::manual_seed(7);
  // One parameter of 2.3 chunks (not a multiple of the chunk), one of a few elements, one
  // matrix below a chunk, and one that gets no gradient.
  return {torch::randn({600, 1000}), torch::randn({17}), torch::randn({64, 64}), torch::randn({5})};
}

template <class Opt>
std::unique_ptr<Opt> make(std::vector<torch::Tensor>& params) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto opts = [](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(3e-3).betas({0.9, 0.95}).eps(1e-8).weight_decay(wd));
  };
  groups.emplace_back(std::vector<torch::Tensor>{params[0], params[2]}, opts(0.1));
  groups.emplace_back(std::vector<torch::Tensor>{params[1], params[3]}, opts(0.0));
  return std::make_unique<Opt>(std::move(groups), torch::optim::AdamWOptions(3e-3));
}

TEST(ChunkedAdamW, EqualsLibTorchAdamWBitwise) {
  auto a = make_params(), b = make_params();
  for (auto* set : {&a, &b})
    for (auto& p : *set) p.requires_grad_(true);
  auto stock = make<torch::optim::AdamW>(a);
  auto chunked = make<lt::trainers::ChunkedAdamW>(b);
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(100 + step);
    for (size_t i = 0; i + 1 < a.size(); ++i) {
      const auto g = torch::randn(a[i].sizes()) * (i + 1);
      a[i].mutable_grad() = g.clone();
      b[i].mutable_grad() = g.clone();
    }
    stock->step();
    chunked->step();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(torch::equal(a[i], b[i])) << "step " << step + 1 << " parameter " << i;
      auto sa = stock->state().find(a[i].unsafeGetTensorImpl());
      auto sb = chunked->state().find(b[i].unsafeGetTensorImpl());
      ASSERT_EQ(sa == stock->state().end(), sb == chunked->state().end()) << i;
      if (sa == stock->state().end()) continue;
      const auto& x = static_cast<torch::optim::AdamWParamState&>(*sa->second);
      const auto& y = static_cast<torch::optim::AdamWParamState&>(*sb->second);
      EXPECT_EQ(x.step(), y.step());
      EXPECT_TRUE(torch::equal(x.exp_avg(), y.exp_avg())) << i;
      EXPECT_TRUE(torch::equal(x.exp_avg_sq(), y.exp_avg_sq())) << i;
    }
  }
  EXPECT_EQ(chunked->state().count(b[3].unsafeGetTensorImpl()), 0u) << "no gradient, no state";
}

// The update of a 16 MiB parameter: LibTorch's allocates two temporaries its size, the
// chunked one two of 1 MiB.
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

TEST(ChunkedAdamW, TemporariesAreBoundedByTheChunk) {
  const int64_t stock = update_extra_bytes<torch::optim::AdamW>();
  const int64_t chunked = update_extra_bytes<lt::trainers::ChunkedAdamW>();
  RecordProperty("stock_extra_bytes", std::to_string(stock));
  RecordProperty("chunked_extra_bytes", std::to_string(chunked));
  EXPECT_GE(stock, 2 * (16 << 20));
  EXPECT_LE(chunked, 3 << 20);
}

}  // namespace
