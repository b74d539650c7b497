// Note [Buckets in flight on a GPU]: under memory.shard = gradients at most
// GradientSync::kMaxBucketsInFlight transient bucket buffers are alive at once, in the
// reduce-scatters during backward and in the all-gather after the update, even when the
// collectives complete late; the back-pressure waits with Work::wait_host (the host sync a GPU
// needs). A communicator of two ranks whose collectives never complete by polling stands in for
// a slow network or a GPU that runs behind the host.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>

#include "leantrain/comm/communicator.h"
#include "leantrain/comm/grad_sync.h"

namespace {

struct Counts {
  int started = 0, host_waits = 0, waits = 0;
};

// Completes only when waited for: test() never sees it done (the artificial delay).
class LateWork final : public lt::comm::Work {
 public:
  explicit LateWork(Counts& c) : c_(c) {}
  bool test() override { return done_; }
  void wait() override {
    if (!done_) ++c_.waits;
    done_ = true;
  }
  void wait_host() override {
    if (!done_) ++c_.host_waits;
    done_ = true;
  }

 private:
  Counts& c_;
  bool done_ = false;
};

// Rank 0 of two identical ranks: the collectives leave this rank's values as they are (their
// sums are not what this test is about; test_comm and the Sharding tests check those).
class LateComm final : public lt::comm::Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  std::string backend() const override { return "late"; }
  void allreduce_sum(torch::Tensor&) override {}
  void broadcast(torch::Tensor&, int) override {}
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override { return {t.clone(), t.clone()}; }
  void barrier() override {}
  std::unique_ptr<lt::comm::Work> reduce_scatter_sum_async(torch::Tensor) override { return late(); }
  std::unique_ptr<lt::comm::Work> allgather_async(torch::Tensor) override { return late(); }
  std::unique_ptr<lt::comm::Work> allreduce_sum_async(torch::Tensor) override { return late(); }

  Counts counts;

 private:
  std::unique_ptr<lt::comm::Work> late() {
    ++counts.started;
    return std::make_unique<LateWork>(counts);
  }
};

torch::nn::Sequential deep_mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 8; ++i) {
    net->push_back(torch::nn::Linear(64, 64));
    net->push_back(torch::nn::Tanh());
  }
  return net;
}

TEST(BucketBound, ShardedGradientsKeepAtMostTwoBucketsAliveWhenCollectivesCompleteLate) {
  auto net = deep_mlp();
  auto params = net->parameters();
  // 16 KiB buckets: one 64x64 fp32 weight each, so backward makes many buckets.
  lt::comm::GradientSync sync(params, 16.0 / 1024, 16.0 / 1024, /*overlap=*/true,
                              lt::comm::ShardStage::kGradients, /*world=*/2, /*rank=*/0);
  ASSERT_GE(sync.num_buckets(), 6u);
  LateComm comm;
  const auto x = torch::randn({4, 64});
  for (int micro = 0; micro < 2; ++micro) {  // accumulation 2: a reduce-scatter per bucket per micro-batch
    const bool last = micro == 1;
    sync.begin_backward(comm, last);
    net->forward(x).pow(2).sum().backward();
    if (last) sync.finish(comm);
    else sync.end_backward(comm);
  }
  EXPECT_EQ(comm.counts.started, static_cast<int>(2 * sync.num_buckets()));
  // The bound holds, and was reached (so a broken bound would show): the back-pressure waited
  // for the oldest bucket on the host once per bucket beyond the first two, per micro-batch.
  EXPECT_EQ(sync.peak_buckets_alive(), lt::comm::GradientSync::kMaxBucketsInFlight);
  EXPECT_EQ(comm.counts.host_waits, static_cast<int>(2 * (sync.num_buckets() - 2)));

  const int before = comm.counts.host_waits;
  sync.allgather_params(comm);
  EXPECT_EQ(sync.peak_buckets_alive(), lt::comm::GradientSync::kMaxBucketsInFlight);
  EXPECT_EQ(comm.counts.host_waits - before, static_cast<int>(sync.num_buckets()));  // every unpack
  for (const auto& p : params) EXPECT_FALSE(p.grad().defined());  // the chunks hold the sums
}

}  // namespace
