// Issue 39, item 2: which GPU a rank runs on (choose_device_index, Note [Rank to GPU] in
// runtime_context.h), the device binding of the threads, and the backend agreement
// (agree_backend, exchange_backend_choices: Note [Backend agreement] in comm/src/communicator.cpp)
// on ranks that are threads of this process (ThreadWorld): a rank that would choose another
// backend makes every rank stop with the same ConfigError, not a hang.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/runtime_context.h"

namespace {

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "'" << (needle) << "' not in: " << (haystack)

using lt::comm::BackendChoice;

// ---------------------------------------------------------------- the rank -> GPU rule

struct HostCase {
  const char* scenario;
  const char* train_device;
  int visible;     // GPUs each rank of the host sees
  int local_size;  // ranks on the host
  std::vector<int> device;  // local rank k's device (-1: the CPU)
};

TEST(DeviceRule, EveryLocalRankRunsOnAGpuItSees) {
  const std::vector<HostCase> table = {
      {"mpirun, one rank per GPU", "auto", 4, 4, {0, 1, 2, 3}},
      {"mpirun, one rank per GPU, cuda", "cuda", 4, 4, {0, 1, 2, 3}},
      {"fewer ranks than GPUs", "auto", 8, 2, {0, 1}},
      {"--gpus-per-task=1: each rank sees its own GPU only", "cuda", 1, 4, {0, 0, 0, 0}},
      {"--gpus-per-task=1, auto (was: local ranks >= 1 on the CPU)", "auto", 1, 4, {0, 0, 0, 0}},
      {"--gpus-per-task=2: its own two, the first for local rank 0", "cuda", 2, 4, {0, 1, 0, 1}},
      {"one process, one GPU", "auto", 1, 1, {0}},
      {"a host without GPUs, auto", "auto", 0, 3, {-1, -1, -1}},
      {"train.device = cpu on a GPU host", "cpu", 4, 2, {-1, -1}},
      {"train.device = cpu, no GPU", "cpu", 0, 1, {-1}},
  };
  for (const auto& c : table)
    for (int k = 0; k < c.local_size; ++k)
      EXPECT_EQ(lt::choose_device_index(c.train_device, c.visible, k, "h"), c.device[static_cast<size_t>(k)])
          << c.scenario << ": local rank " << k;
}

TEST(DeviceRule, CudaWithoutAVisibleGpuIsAConfigErrorNamingTheRankAndHost) {
  try {
    lt::choose_device_index("cuda", 0, 3, "node7");
    FAIL() << "train.device = cuda with no GPU visible must be a ConfigError";
  } catch (const lt::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_CONTAINS(m, "train.device = 'cuda'");
    EXPECT_CONTAINS(m, "local rank 3 on host node7");
    EXPECT_CONTAINS(m, "CUDA_VISIBLE_DEVICES");
    EXPECT_CONTAINS(m, "'auto' or 'cpu'");
  }
  EXPECT_THROW(lt::choose_device_index("auto", 2, -1), std::invalid_argument);
}

TEST(DeviceRule, RuntimeContextOfALaterLocalRankOnThisMachine) {
  lt::Config cfg;
  lt::World world;
  world.rank = world.local_rank = 1;
  world.size = world.local_size = 2;
  world.host = "here";
  const bool gpu = lt::cuda_device_count() > 0;
  cfg.train.device = "cpu";
  EXPECT_EQ(lt::make_runtime_context(cfg, world).device_index, -1);
  cfg.train.device = "auto";
  EXPECT_EQ(lt::make_runtime_context(cfg, world).device_index, gpu ? 1 % lt::cuda_device_count() : -1);
  if (gpu) return;
  cfg.train.device = "cuda";
  try {
    lt::make_runtime_context(cfg, world);
    FAIL() << "train.device = cuda without a GPU";
  } catch (const lt::ConfigError& e) {
    EXPECT_CONTAINS(e.what(), "local rank 1 on host here");
  }
}

TEST(DeviceBinding, ThreadsStartUnboundAndInheritTheirStartersDevice) {
  EXPECT_EQ(lt::bound_device(), -1);
  const int dev = lt::cuda_device_count() > 0 ? 0 : -1;  // -1: bind_device only remembers
  lt::bind_device(dev);
  EXPECT_EQ(lt::bound_device(), dev);
  int fresh = 42, inherited = 42;
  std::thread([&fresh, &inherited, d = lt::bound_device()] {
    fresh = lt::bound_device();
    lt::bind_device(d);
    inherited = lt::bound_device();
  }).join();
  EXPECT_EQ(fresh, -1);
  EXPECT_EQ(inherited, dev);
  lt::bind_device(-1);
}

// ---------------------------------------------------------------- the backend agreement

BackendChoice choice(int rank, const std::string& host, int device, const std::string& backend,
                     const std::string& error = "") {
  BackendChoice c;
  c.rank = rank;
  c.host = host;
  c.device_index = device;
  c.backend = backend;
  c.error = error;
  return c;
}

std::string agreement_error(const std::vector<BackendChoice>& ranks, const std::string& requested) {
  try {
    const std::string b = lt::comm::agree_backend(ranks, requested);
    return "agreed on " + b;
  } catch (const lt::ConfigError& e) {
    return e.what();
  }
}

TEST(BackendAgreement, RanksThatAgreeRunTheirChoice) {
  EXPECT_EQ(lt::comm::agree_backend({choice(0, "a", 0, "nccl"), choice(1, "a", 1, "nccl"), choice(2, "b", 0, "nccl")}, "auto"),
            "nccl");
  EXPECT_EQ(lt::comm::agree_backend({choice(0, "a", -1, "mpi"), choice(1, "b", -1, "mpi")}, "auto"), "mpi");
  // comm.backend = mpi with some ranks on GPUs: MPI carries CUDA tensors through host memory.
  EXPECT_EQ(lt::comm::agree_backend({choice(0, "a", 0, "mpi"), choice(1, "b", -1, "mpi")}, "mpi"), "mpi");
  EXPECT_THROW(lt::comm::agree_backend({}, "auto"), std::invalid_argument);
}

TEST(BackendAgreement, ARankThatChoseDifferentlyIsAConfigErrorNamingIt) {
  // Rank 1's host has no GPU: auto gave it the CPU and MPI, the others a GPU and NCCL.
  const std::string m =
      agreement_error({choice(0, "gpu1", 0, "nccl"), choice(1, "cpu9", -1, "mpi"), choice(2, "gpu1", 1, "nccl")}, "auto");
  EXPECT_EQ(m.rfind("comm.backend = 'auto' resolves differently across the ranks: ", 0), 0u) << m;
  EXPECT_CONTAINS(m, "rank 0 on host gpu1 (cuda:0) chose nccl, but rank 1 on host cpu9 (the CPU) chose mpi;");
  EXPECT_EQ(m.find("rank 2"), std::string::npos) << m;  // it agrees with rank 0
  EXPECT_CONTAINS(m, "give every rank a GPU");
  EXPECT_CONTAINS(m, "train.device = cpu");
  EXPECT_CONTAINS(m, "comm.backend = 'mpi'");
  // Rank 0 itself the odd one: every other rank is named, the first few of many.
  std::vector<BackendChoice> many{choice(0, "x", -1, "mpi")};
  for (int r = 1; r < 8; ++r) many.push_back(choice(r, "g", r % 4, "nccl"));
  const std::string n = agreement_error(many, "auto");
  EXPECT_CONTAINS(n, "rank 0 on host x (the CPU) chose mpi, but rank 1 on host g (cuda:1) chose nccl, rank 2");
  EXPECT_CONTAINS(n, "rank 4 on host g (cuda:0) chose nccl and 3 more ranks differ;");
}

TEST(BackendAgreement, ARefusalOnOneRankStopsEveryRankWithItsMessage) {
  const std::string refusal = "comm.backend = 'nccl' needs the run on a GPU, but the device is the CPU; set ...";
  const std::string m = agreement_error(
      {choice(0, "a", 0, "nccl"), choice(1, "b", -1, "", refusal), choice(2, "c", -1, "", refusal)}, "nccl");
  EXPECT_EQ(m, "rank 1 on host b (the CPU): " + refusal + " (so did rank 2)");
}

// Ranks as threads of this process: allgather meets every rank's tensor (a generation barrier).
// Each thread holds its own ThreadRank; they share one ThreadWorld.
struct ThreadWorld {
  explicit ThreadWorld(int n) : size(n), slots(static_cast<size_t>(n)) {}
  int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  int64_t generation = 0;
  std::vector<torch::Tensor> slots, result;
  int64_t allgathers = 0;
};

class ThreadRank final : public lt::comm::Communicator {
 public:
  ThreadRank(ThreadWorld& w, int rank) : w_(w), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return w_.size; }
  std::string backend() const override { return "threads"; }
  void allreduce_sum(torch::Tensor&) override { ADD_FAILURE() << "the agreement all-gathers only"; }
  void broadcast(torch::Tensor&, int) override { ADD_FAILURE() << "the agreement all-gathers only"; }
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override {
    std::unique_lock<std::mutex> lk(w_.mu);
    w_.slots[static_cast<size_t>(rank_)] = t.clone();
    if (++w_.arrived == w_.size) {
      w_.result = w_.slots;
      w_.arrived = 0;
      ++w_.generation;
      ++w_.allgathers;
      w_.cv.notify_all();
    } else {
      const int64_t g = w_.generation;
      w_.cv.wait(lk, [&] { return w_.generation != g; });
    }
    return w_.result;  // stays until every rank has come for the next all-gather
  }
  void barrier() override {}

 private:
  ThreadWorld& w_;
  int rank_;
};

struct RankOutcome {
  std::string backend;  // agreed
  std::string error;    // or the ConfigError's message
  std::vector<BackendChoice> seen;
};

// Every rank exchanges its choice and agrees, each on its own thread (as make_communicator does
// over MPI).
std::vector<RankOutcome> agree_on_threads(const std::vector<BackendChoice>& choices, const std::string& requested,
                                          int64_t* allgathers = nullptr) {
  ThreadWorld world(static_cast<int>(choices.size()));
  std::vector<RankOutcome> out(choices.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < choices.size(); ++r)
    threads.emplace_back([&, r] {
      ThreadRank comm(world, static_cast<int>(r));
      try {
        out[r].seen = lt::comm::exchange_backend_choices(comm, choices[r]);
        out[r].backend = lt::comm::agree_backend(out[r].seen, requested);
      } catch (const lt::ConfigError& e) {
        out[r].error = e.what();
      } catch (const std::exception& e) {
        out[r].error = std::string("unexpected: ") + e.what();
      }
    });
  for (auto& t : threads) t.join();
  if (allgathers != nullptr) *allgathers = world.allgathers;
  return out;
}

TEST(BackendExchange, EveryRankSeesEveryChoiceInRankOrder) {
  const std::vector<BackendChoice> choices = {choice(0, "a-long-host-name.cluster", 0, "nccl"),
                                              choice(1, "b", 1, "nccl"), choice(2, "c", 0, "nccl")};
  int64_t allgathers = 0;
  const auto out = agree_on_threads(choices, "auto", &allgathers);
  EXPECT_EQ(allgathers, 2);  // the lengths, then the choices
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].error, "") << "rank " << r;
    EXPECT_EQ(out[r].backend, "nccl") << "rank " << r;
    ASSERT_EQ(out[r].seen.size(), choices.size());
    for (size_t k = 0; k < choices.size(); ++k) {
      EXPECT_EQ(out[r].seen[k].rank, static_cast<int>(k));
      EXPECT_EQ(out[r].seen[k].host, choices[k].host);
      EXPECT_EQ(out[r].seen[k].device_index, choices[k].device_index);
      EXPECT_EQ(out[r].seen[k].backend, choices[k].backend);
      EXPECT_EQ(out[r].seen[k].error, "");
    }
  }
}

TEST(BackendExchange, ARankThatWouldChooseDifferentlyStopsEveryRankWithOneMessage) {
  // Rank 2 sees no GPU (its host has none, or CUDA_VISIBLE_DEVICES hid them): auto gives it
  // MPI while ranks 0 and 1 chose NCCL. Before the agreement, 0 and 1 waited in NCCL's
  // initialisation for a rank that never came.
  const auto out = agree_on_threads({choice(0, "g", 0, "nccl"), choice(1, "g", 1, "nccl"), choice(2, "n", -1, "mpi")},
                                    "auto");
  for (size_t r = 0; r < out.size(); ++r) {
    EXPECT_EQ(out[r].backend, "") << "rank " << r;
    EXPECT_EQ(out[r].error, out[0].error) << "rank " << r;  // every rank, the same line
    EXPECT_CONTAINS(out[r].error, "rank 0 on host g (cuda:0) chose nccl, but rank 2 on host n (the CPU) chose mpi");
  }
}

TEST(BackendExchange, ARankThatRefusedStopsEveryRank) {
  const std::string refusal = "comm.backend = 'nccl' needs the run on a GPU, but the device is the CPU";
  const auto out = agree_on_threads({choice(0, "g", 0, "nccl"), choice(1, "n", -1, "", refusal)}, "nccl");
  for (const auto& o : out) EXPECT_EQ(o.error, "rank 1 on host n (the CPU): " + refusal);
}

}  // namespace
