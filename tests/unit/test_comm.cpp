// Bucket assignment (a pure function) and gradient synchronisation's call pattern.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "leantrain/comm/buckets.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/comm/grad_sync.h"

namespace {

using lt::comm::assign_buckets;

TEST(Buckets, SmallFirstBucketThenCap) {
  // 10 tensors of 100 bytes: first cap 150 closes after 2, then cap 300 closes every 3.
  std::vector<lt::comm::BucketTensor> t(10, {100, 0});
  auto b = assign_buckets(t, 150, 300);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b[0], (std::vector<size_t>{0, 1}));
  EXPECT_EQ(b[1], (std::vector<size_t>{2, 3, 4}));
  EXPECT_EQ(b[2], (std::vector<size_t>{5, 6, 7}));
  EXPECT_EQ(b[3], (std::vector<size_t>{8, 9}));
}

TEST(Buckets, EveryTensorOnceAndDtypesApart) {
  std::vector<lt::comm::BucketTensor> t = {{10, 0}, {10, 1}, {1000, 0}, {10, 1}, {10, 0}};
  auto b = assign_buckets(t, 50, 500);
  std::multiset<size_t> seen;
  for (auto& bucket : b) {
    std::set<int> dtypes;
    for (size_t i : bucket) {
      seen.insert(i);
      dtypes.insert(t[i].dtype);
    }
    EXPECT_EQ(dtypes.size(), 1u);
  }
  EXPECT_EQ(seen, (std::multiset<size_t>{0, 1, 2, 3, 4}));
  // The 1000-byte tensor exceeds the cap: its bucket closes right after it.
  bool alone_or_closing = false;
  for (auto& bucket : b)
    if (bucket.back() == 2) alone_or_closing = true;
  EXPECT_TRUE(alone_or_closing);
}

TEST(GradientSync, OneAllReducePerBucketAndValuesKept) {
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(64, 64), torch::nn::ReLU(), torch::nn::Linear(64, 64),
                            torch::nn::ReLU(), torch::nn::Linear(64, 8));
  auto params = net->parameters();
  net->forward(torch::randn({4, 64})).sum().backward();
  std::vector<torch::Tensor> before;
  for (auto& p : params) before.push_back(p.grad().clone());
  // Caps in MiB: 16 KiB first bucket, 32 KiB later ones (a 64x64 fp32 weight is 16 KiB).
  lt::comm::GradientSync sync(params, 16.0 / 1024, 32.0 / 1024);
  EXPECT_GT(sync.num_buckets(), 1u);
  lt::comm::LocalCommunicator comm;
  sync.all_reduce(comm);
  EXPECT_EQ(comm.stats().allreduce_calls, static_cast<int64_t>(sync.num_buckets()));
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i].grad(), before[i]));
}

}  // namespace
