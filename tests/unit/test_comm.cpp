// Bucket assignment (a pure function) and gradient synchronisation's call pattern: with
// overlap, bucket all-reduces start inside backward from gradient-ready hooks, exactly once
// per bucket, in bucket order, never during earlier micro-batches, with the same sums as the
// non-overlapped path (a recording communicator fakes the sum of two identical ranks).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "leantrain/comm/buckets.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/comm/grad_sync.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/model.h"

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

// Note [Gradients in the parameter's layout]: a channels-last convolution weight's gradient
// stays channels-last through the buckets (its alias has the parameter's strides), so a fused
// optimizer, which walks parameter and gradient in memory order, updates each weight with its
// own gradient. Before: the alias was row-major and at::_fused_sgd_ mixed the weights up.
TEST(GradientSync, ChannelsLastGradientsKeepTheirLayout) {
  torch::manual_seed(0);
  torch::nn::Conv2d conv(torch::nn::Conv2dOptions(3, 8, 3).padding(1));
  torch::nn::Linear head(8, 4);
  {
    torch::NoGradGuard no_grad;
    conv->weight.set_data(conv->weight.contiguous(torch::MemoryFormat::ChannelsLast));
  }
  auto params = conv->parameters();
  for (auto& p : head->parameters()) params.push_back(p);
  ASSERT_FALSE(params[0].is_contiguous());  // the weight is channels-last
  auto x = torch::randn({2, 3, 5, 5}).contiguous(torch::MemoryFormat::ChannelsLast);
  head->forward(conv->forward(x).mean({2, 3})).pow(2).sum().backward();
  std::vector<torch::Tensor> before;
  for (auto& p : params) before.push_back(p.grad().clone(torch::MemoryFormat::Preserve));
  lt::comm::GradientSync sync(params, 16.0 / 1024, 32.0 / 1024);
  lt::comm::LocalCommunicator comm;
  sync.all_reduce(comm);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << i;
    EXPECT_EQ(params[i].grad().strides(), params[i].strides()) << i;
  }
  // The fused SGD step with the synced gradients equals the step with autograd's own.
  auto step = [](const std::vector<torch::Tensor>& ps, const std::vector<torch::Tensor>& gs) {
    std::vector<torch::Tensor> out, grads, bufs;
    for (size_t i = 0; i < ps.size(); ++i) {
      out.push_back(ps[i].detach().clone(torch::MemoryFormat::Preserve));
      grads.push_back(gs[i]);
      bufs.push_back(torch::zeros_like(ps[i], torch::MemoryFormat::Preserve));
    }
    at::_fused_sgd_(out, grads, bufs, 0.0, 0.9, 0.1, 0.0, false, false, true);
    return out;
  };
  std::vector<torch::Tensor> synced;
  for (auto& p : params) synced.push_back(p.grad());
  const auto a = step(params, synced), b = step(params, before);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << i;
}

// A world of one whose "sum" doubles the tensor (two identical ranks), completed only in
// wait() or after a few test() calls, like a real collective in flight. It records, for each
// all-reduce, its size, what it was handed to sum (a copy, taken at the call) and how many of
// the watched parameters had a gradient by then (a defined, non-zero one: from the buckets'
// allocation on, a parameter's .grad is its zeroed slot until backward writes it).
class RecordingComm final : public lt::comm::Communicator {
 public:
  struct Call {
    int64_t numel;
    size_t grads_computed;
    torch::Tensor sent;
  };
  std::vector<Call> calls;
  std::vector<torch::Tensor> watched;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "recording"; }
  void allreduce_sum(torch::Tensor& t) override {
    record(t);
    t.mul_(2);
  }
  std::unique_ptr<lt::comm::Work> allreduce_sum_async(torch::Tensor t) override {
    record(t);
    return std::make_unique<DeferredWork>(t);
  }
  void broadcast(torch::Tensor&, int) override {}
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override { return {t.clone()}; }
  void barrier() override {}

 private:
  class DeferredWork final : public lt::comm::Work {
   public:
    explicit DeferredWork(torch::Tensor t) : t_(std::move(t)) {}
    bool test() override {
      if (!done_ && ++tests_ >= 3) complete();
      return done_;
    }
    void wait() override {
      if (!done_) complete();
    }

   private:
    void complete() {
      t_.mul_(2);
      done_ = true;
    }
    torch::Tensor t_;
    int tests_ = 0;
    bool done_ = false;
  };

  void record(const torch::Tensor& t) {
    size_t defined = 0;
    for (auto& p : watched) defined += p.grad().defined() && p.grad().ne(0).any().item<bool>() ? 1 : 0;
    calls.push_back({t.numel(), defined, t.detach().clone()});
    ++stats_.allreduce_calls;
    stats_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
  }
};

torch::nn::Sequential deep_mlp() {
  torch::manual_seed(0);
  torch::nn::Sequential net;
  for (int i = 0; i < 6; ++i) {
    net->push_back(torch::nn::Linear(64, 64));
    net->push_back(torch::nn::Tanh());
  }
  net->push_back(torch::nn::Linear(64, 8));
  return net;
}

// Caps in MiB: 16 KiB first bucket, 32 KiB later ones (a 64x64 fp32 weight is 16 KiB).
constexpr double kFirstMb = 16.0 / 1024, kCapMb = 32.0 / 1024;

// Call k is bucket k: its size and its contents are those of bucket k's gradients, packed
// in bucket order. The buckets are derived here from assign_buckets over the parameters in
// reverse order (grad_sync.h), the gradients from a twin network's plain backward, so a
// bucket started out of order, twice, or packed from the wrong parameters fails.
TEST(GradientSyncOverlap, StartsBucketsInsideBackwardOncePerBucketInOrder) {
  auto net = deep_mlp();
  auto params = net->parameters();
  lt::comm::GradientSync sync(params, kFirstMb, kCapMb);
  ASSERT_GE(sync.num_buckets(), 4u);
  torch::manual_seed(7);
  const auto x = torch::randn({4, 64});

  // The reference: the same weights (deep_mlp seeds itself), the same batch, no hooks.
  auto twin = deep_mlp();
  auto twin_params = twin->parameters();
  twin->forward(x).pow(2).sum().backward();
  std::vector<torch::Tensor> reversed(twin_params.rbegin(), twin_params.rend());
  std::vector<lt::comm::BucketTensor> sizes;
  for (const auto& p : reversed)
    sizes.push_back({static_cast<int64_t>(p.numel() * p.element_size()), static_cast<int>(p.scalar_type())});
  const auto buckets = assign_buckets(sizes, static_cast<int64_t>(kFirstMb * 1048576.0),
                                      static_cast<int64_t>(kCapMb * 1048576.0));
  ASSERT_EQ(buckets.size(), sync.num_buckets());
  // The first bucket is the last layer (8x64 weight + bias) and the one before it (64x64 + 64).
  EXPECT_EQ(buckets.front(), (std::vector<size_t>{0, 1, 2, 3}));

  RecordingComm comm;
  comm.watched = params;
  sync.begin_last_backward(comm);
  net->forward(x).pow(2).sum().backward();
  // Backward has returned, finish() not yet called: buckets were started from the hooks.
  ASSERT_GE(comm.calls.size(), 1u);
  EXPECT_EQ(sync.last_times().started_in_backward, static_cast<int64_t>(comm.calls.size()));
  EXPECT_EQ(comm.calls.size(), sync.num_buckets());  // every parameter is used: all started
  // The first bucket (the last layer) started while the first layer's gradient did not exist yet.
  EXPECT_LT(comm.calls.front().grads_computed, params.size());
  EXPECT_FALSE(comm.calls.empty() || comm.calls.front().grads_computed == 0);
  sync.finish(comm);
  ASSERT_EQ(comm.calls.size(), sync.num_buckets());  // exactly one all-reduce per bucket
  // In bucket order: call k carries bucket k's gradients, in that bucket's member order.
  for (size_t k = 0; k < buckets.size(); ++k) {
    SCOPED_TRACE("bucket " + std::to_string(k));
    std::vector<torch::Tensor> parts;
    for (size_t i : buckets[k]) parts.push_back(reversed[i].grad().reshape({-1}));
    const auto want = torch::cat(parts);
    EXPECT_EQ(comm.calls[k].numel, want.numel());
    ASSERT_EQ(comm.calls[k].sent.sizes(), want.sizes());
    EXPECT_TRUE(torch::equal(comm.calls[k].sent, want));
  }
  EXPECT_EQ(comm.calls.front().numel, 8 * 64 + 8 + 64 * 64 + 64);
  // And the sums (two identical ranks) are back in every .grad.
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_TRUE(torch::equal(params[i].grad(), twin_params[i].grad() * 2)) << "param " << i;
  EXPECT_GT(sync.buffer_bytes(), 0);
}

// Two micro-batches each way: overlapped (hooks armed for the second backward only) versus
// all_reduce() after both. The sums must agree bit for bit, and the first micro-batch must
// issue nothing — also in the second step, when the hooks are already installed.
TEST(GradientSyncOverlap, MatchesNonOverlappedBitwiseAndEarlierMicroBatchesAreSilent) {
  auto a = deep_mlp();
  auto b = deep_mlp();
  auto pa = a->parameters(), pb = b->parameters();
  lt::comm::GradientSync sa(pa, kFirstMb, kCapMb), sb(pb, kFirstMb, kCapMb);
  // The optimizer's zero_grad runs on gradients that alias the bucket buffers (it detach_()es).
  torch::optim::SGD oa(pa, torch::optim::SGDOptions(0.1)), ob(pb, torch::optim::SGDOptions(0.1));
  RecordingComm ca, cb;
  torch::manual_seed(1);
  const std::vector<torch::Tensor> batches = {torch::randn({4, 64}), torch::randn({4, 64})};
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    // Steps 0 and 1 start from no gradients (the trainer's way); step 2 from zeroed ones,
    // which then accumulate in place in the bucket buffers.
    oa.zero_grad(/*set_to_none=*/step < 2);
    ob.zero_grad(/*set_to_none=*/step < 2);
    ca.calls.clear();
    a->forward(batches[0]).pow(2).sum().div(4).backward();
    EXPECT_TRUE(ca.calls.empty()) << "an earlier micro-batch communicated";
    sa.begin_last_backward(ca);
    a->forward(batches[1]).pow(2).sum().div(4).backward();
    EXPECT_GE(sa.last_times().started_in_backward, 1);
    sa.finish(ca);
    EXPECT_EQ(ca.calls.size(), sa.num_buckets());

    for (auto& x : batches) b->forward(x).pow(2).sum().div(4).backward();
    sb.all_reduce(cb);
    EXPECT_EQ(sb.last_times().started_in_backward, 0);
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i].grad(), pb[i].grad())) << "param " << i;
    oa.step();
    ob.step();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(torch::equal(pa[i], pb[i])) << "param " << i;
  }
}

// GPT's tied embedding/head (one parameter used twice, in the chunked loss too) under full
// activation recompute, where backward re-enters: every hook fires once (a second
// firing throws), buckets start inside backward, and the sums match the non-overlapped path.
TEST(GradientSyncOverlap, TiedEmbeddingUnderActivationRecompute) {
  lt::models::ModelConfig cfg;
  cfg.kind = "gpt";
  cfg.vocab_size = 96;
  cfg.seq_len = 16;
  cfg.n_layer = 3;
  cfg.n_head = 2;
  cfg.d_model = 32;
  auto run = [&](bool overlap, RecordingComm& comm, lt::comm::GradientSync*& out_sync,
                 std::unique_ptr<lt::comm::GradientSync>& holder, std::shared_ptr<lt::models::Model>& model) {
    torch::manual_seed(3);
    model = lt::models::build_model(cfg);
    model->train();
    lt::models::apply_recompute_policy(*model, lt::models::RecomputePolicy::parse("full"));
    model->set_loss_chunk_tokens(16);  // 4 x 16 tokens: four recomputed head chunks
    auto params = model->parameters();
    holder = std::make_unique<lt::comm::GradientSync>(params, 8.0 / 1024, 16.0 / 1024, overlap);
    out_sync = holder.get();
    torch::manual_seed(4);
    auto x = torch::randint(0, cfg.vocab_size, {4, cfg.seq_len});
    auto y = torch::randint(0, cfg.vocab_size, {4, cfg.seq_len});
    model->forward_loss(x, y).backward();  // an earlier micro-batch
    EXPECT_TRUE(comm.calls.empty());
    out_sync->begin_last_backward(comm);
    model->forward_loss(y, x).backward();
    if (overlap) {
      // Every hook fired inside backward: all buckets started before it returned.
      EXPECT_EQ(out_sync->last_times().started_in_backward, static_cast<int64_t>(out_sync->num_buckets()));
      EXPECT_EQ(comm.calls.size(), out_sync->num_buckets());
    } else {
      EXPECT_TRUE(comm.calls.empty());
    }
    out_sync->finish(comm);
    EXPECT_EQ(comm.calls.size(), out_sync->num_buckets());
    return params;
  };
  RecordingComm c1, c2;
  lt::comm::GradientSync *s1 = nullptr, *s2 = nullptr;
  std::unique_ptr<lt::comm::GradientSync> h1, h2;
  std::shared_ptr<lt::models::Model> m1, m2;
  auto p1 = run(true, c1, s1, h1, m1);
  auto p2 = run(false, c2, s2, h2, m2);
  ASSERT_GE(s1->num_buckets(), 3u);
  ASSERT_EQ(p1.size(), p2.size());
  for (size_t i = 0; i < p1.size(); ++i) EXPECT_TRUE(torch::equal(p1[i].grad(), p2[i].grad())) << "param " << i;
}

// A parameter that gets no gradient this step (unused branch) neither blocks the buckets nor
// deadlocks: finish() counts it as zeros and still issues every bucket once, in order.
TEST(GradientSyncOverlap, ParameterWithoutGradientIsMarkedReadyAtTheEnd) {
  torch::manual_seed(0);
  torch::nn::Linear used1(64, 64), unused(64, 64), used2(64, 64);
  std::vector<torch::Tensor> params;
  for (auto* l : {&used1, &unused, &used2})
    for (auto& p : (*l)->parameters()) params.push_back(p);
  lt::comm::GradientSync sync(params, kFirstMb, kFirstMb);
  RecordingComm comm;
  sync.begin_last_backward(comm);
  used2->forward(used1->forward(torch::randn({4, 64}))).sum().backward();
  sync.finish(comm);
  EXPECT_EQ(comm.calls.size(), sync.num_buckets());
  EXPECT_TRUE(torch::equal(unused->weight.grad(), torch::zeros_like(unused->weight)));
  EXPECT_TRUE(used1->weight.grad().abs().sum().item<double>() > 0);
}

}  // namespace
