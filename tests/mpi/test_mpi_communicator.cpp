// The MPI backend on two real ranks (tests/mpi/CMakeLists.txt runs this under mpiexec -np 2):
// the communicator comes from the project's factory (make_communicator, as launch/ makes
// it), and every collective's result is checked exactly on every rank: all-reduce (every
// dtype, the staged paths, many at once, asynchronous), broadcast from each root, all-gather
// in rank order, the sharded pair (reduce-scatter into this rank's chunk, all-gather in
// place: Note [Shard chunks]), and a barrier that waits for the slowest rank.
//
// main() initialises MPI itself (so the communicator does not own it and MPI outlives the
// tests), runs the tests on every rank, and returns the AND of every rank's result
// (all-reduced with MPI_LAND): a failure on rank 1 alone fails the job, and rank 0 prints
// which ranks failed. Ranks other than 0 print only their failures, prefixed with the rank.
//
// Two more modes, for the negative tests in tests/mpi/CMakeLists.txt:
//   --miss-a-deadline  rank 0 enters a barrier with a 1 s deadline that rank 1 never joins:
//                      the job must end with exit code 3 and a report naming rank 1;
//   --miss-a-deadline=reduce-scatter  the same in a reduce-scatter (rank 0's wait());
//   LEANTRAIN_MPI_TEST_FAIL_RANK=r  MpiHarness.FailsOnTheRankNamedByTheEnvironment fails
//                      on rank r only: the job must exit 1.
#include <mpi.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"

namespace {

// A test that leaves the ranks in different collectives ends at this deadline (exit 3),
// well inside ctest's TIMEOUT.
constexpr double kDeadlineS = 30;

// The communicator as launch/src/commands.cpp makes it: the launcher's world, a CPU run.
std::unique_ptr<lt::comm::Communicator> make_comm(const std::string& backend = "mpi") {
  lt::CommConfig cfg;
  cfg.backend = backend;
  cfg.startup_timeout_s = kDeadlineS;
  lt::RuntimeContext ctx;
  ctx.world = lt::detect_world();
  ctx.device_index = -1;
  return lt::comm::make_communicator(cfg, ctx);
}

class Mpi : public ::testing::Test {
 protected:
  void SetUp() override {
    comm_ = make_comm();
    ASSERT_EQ(comm_->size(), 2) << "run under mpiexec -np 2";
    rank_ = comm_->rank();
  }
  std::unique_ptr<lt::comm::Communicator> comm_;
  int rank_ = -1;
};

TEST_F(Mpi, FactoryMakesTheMpiBackendForTheLaunchersWorld) {
  const lt::World world = lt::detect_world();
  EXPECT_EQ(world.launcher, "openmpi");
  EXPECT_EQ(world.size, 2);
  EXPECT_EQ(comm_->backend(), "mpi");
  EXPECT_EQ(comm_->rank(), world.rank);
  // auto on a CPU world of two is MPI as well; local cannot serve two ranks.
  EXPECT_EQ(make_comm("auto")->backend(), "mpi");
  EXPECT_THROW(make_comm("local"), lt::ConfigError);
}

// Rank r holds (i % 50) * (r + 1) + r (+ 1/8 in fp32/fp64): the sum over both ranks is
// (i % 50) * 3 + 1 (+ 1/4), at most 148.25 — every value exact in its dtype (uint8 and bf16's
// 8 significant bits included), so the sums must be exact too.
torch::Tensor rank_values(int64_t n, int rank, torch::ScalarType dtype) {
  auto i = torch::arange(n, torch::kDouble).remainder(50);
  auto v = i * (rank + 1) + rank;
  if (dtype == torch::kFloat || dtype == torch::kDouble) v = v + 0.125;
  return v.to(dtype);
}
torch::Tensor expected_sum(int64_t n, torch::ScalarType dtype) {
  auto i = torch::arange(n, torch::kDouble).remainder(50);
  auto v = i * 3 + 1;
  if (dtype == torch::kFloat || dtype == torch::kDouble) v = v + 0.25;
  return v.to(dtype);
}

TEST_F(Mpi, AllreduceSumIsExactInEveryDtype) {
  int64_t calls = 0;
  for (auto dtype : {torch::kFloat, torch::kDouble, torch::kInt, torch::kLong, torch::kByte, torch::kBFloat16,
                     torch::kHalf}) {
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " x " + std::to_string(n));
      auto t = rank_values(n, rank_, dtype);
      const void* before = t.data_ptr();
      comm_->allreduce_sum(t);
      ++calls;
      EXPECT_EQ(t.data_ptr(), before);  // in place (bf16/half: written back from fp32)
      EXPECT_EQ(t.scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(t, expected_sum(n, dtype)));
    }
  }
  EXPECT_EQ(comm_->stats().allreduce_calls, calls);
}

TEST_F(Mpi, AllreduceSumOfANonContiguousViewAndOfAScalar) {
  // A transposed view is reduced through a contiguous copy and written back into the view.
  auto base = rank_values(6 * 4, rank_, torch::kFloat).view({6, 4});
  auto view = base.t();
  ASSERT_FALSE(view.is_contiguous());
  comm_->allreduce_sum(view);
  EXPECT_TRUE(torch::equal(base, expected_sum(6 * 4, torch::kFloat).view({6, 4})));
  // A 0-d tensor (the trainer's loss and flags).
  auto s = torch::tensor(static_cast<double>(rank_ + 1) * 0.5, torch::kDouble).reshape({});
  comm_->allreduce_sum(s);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<double>(), 1.5);
}

TEST_F(Mpi, AllreduceSumManyAndAsynchronous) {
  std::vector<torch::Tensor> many = {rank_values(7, rank_, torch::kFloat), rank_values(300, rank_, torch::kLong),
                                     rank_values(33, rank_, torch::kBFloat16)};
  comm_->allreduce_sum_many(many);
  EXPECT_TRUE(torch::equal(many[0], expected_sum(7, torch::kFloat)));
  EXPECT_TRUE(torch::equal(many[1], expected_sum(300, torch::kLong)));
  EXPECT_TRUE(torch::equal(many[2], expected_sum(33, torch::kBFloat16)));
  EXPECT_EQ(comm_->stats().allreduce_calls, 3);

  // Three in flight at once (as gradient buckets are); completed by test() polling, and by
  // wait() in the reverse order of their start.
  std::vector<torch::Tensor> t = {rank_values(1 << 16, rank_, torch::kFloat), rank_values(5, rank_, torch::kDouble),
                                  rank_values(1000, rank_, torch::kHalf)};
  std::vector<std::unique_ptr<lt::comm::Work>> work;
  for (auto& x : t) work.push_back(comm_->allreduce_sum_async(x));
  EXPECT_EQ(comm_->stats().allreduce_calls, 6);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!work[0]->test() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(work[0]->test()) << "an all-reduce polled with test() never completed";
  for (size_t k = work.size(); k-- > 0;) work[k]->wait();
  EXPECT_TRUE(torch::equal(t[0], expected_sum(1 << 16, torch::kFloat)));
  EXPECT_TRUE(torch::equal(t[1], expected_sum(5, torch::kDouble)));
  EXPECT_TRUE(torch::equal(t[2], expected_sum(1000, torch::kHalf)));  // staged: written back on completion
  for (auto& w : work) EXPECT_TRUE(w->test());
}

// The sharded pair (Note [Shard chunks]) on 2 ranks: n elements split into two chunks of n/2.
// Sizes: empty, a chunk of one, odd chunks (7, 2^19 + 1) and an even one.
const std::vector<int64_t> kShardSizes = {0, 2, 14, 1000, (int64_t{1} << 20) + 2};
const std::vector<torch::ScalarType> kShardDtypes = {torch::kFloat, torch::kDouble, torch::kLong, torch::kBFloat16};

TEST_F(Mpi, ReduceScatterSumLeavesThisRanksChunkSummedInEveryDtype) {
  for (auto dtype : kShardDtypes) {
    for (int64_t n : kShardSizes) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " x " + std::to_string(n));
      auto t = rank_values(n, rank_, dtype);
      const void* before = t.data_ptr();
      comm_->reduce_scatter_sum_async(t)->wait();
      EXPECT_EQ(t.data_ptr(), before);  // in place (bf16: this rank's chunk written back from fp32)
      EXPECT_EQ(t.scalar_type(), dtype);
      EXPECT_EQ(t.numel(), n);
      const auto mine = lt::comm::shard_chunk(t, rank_, 2);
      EXPECT_EQ(mine.numel(), n / 2);
      EXPECT_TRUE(torch::equal(mine, lt::comm::shard_chunk(expected_sum(n, dtype), rank_, 2)))
          << "rank " << rank_ << "'s chunk: " << mine.slice(0, 0, 8);
    }
  }
}

TEST_F(Mpi, AllgatherAsyncFillsEveryChunkWithItsOwnersValues) {
  for (auto dtype : kShardDtypes) {
    for (int64_t n : kShardSizes) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " x " + std::to_string(n));
      // The other rank's chunk starts as garbage here; only its owner's values may survive.
      auto t = torch::full({n}, -7.0, torch::TensorOptions().dtype(dtype));
      lt::comm::shard_chunk(t, rank_, 2).copy_(lt::comm::shard_chunk(rank_values(n, rank_, dtype), rank_, 2));
      const void* before = t.data_ptr();
      comm_->allgather_async(t)->wait();
      EXPECT_EQ(t.data_ptr(), before);
      EXPECT_EQ(t.scalar_type(), dtype);
      for (int r = 0; r < 2; ++r)
        EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(t, r, 2), lt::comm::shard_chunk(rank_values(n, r, dtype), r, 2)))
            << "chunk " << r << " on rank " << rank_ << ": " << lt::comm::shard_chunk(t, r, 2).slice(0, 0, 8);
    }
  }
}

// The ring all-reduce is these two phases: the same buffer through both equals an all-reduce,
// on every rank, bitwise (the sums are exact).
TEST_F(Mpi, ReduceScatterThenAllgatherIsAnAllreduce) {
  for (auto dtype : kShardDtypes) {
    for (int64_t n : kShardSizes) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " x " + std::to_string(n));
      auto t = rank_values(n, rank_, dtype);
      auto reference = t.clone();
      comm_->reduce_scatter_sum_async(t)->wait();
      comm_->allgather_async(t)->wait();
      comm_->allreduce_sum(reference);
      EXPECT_TRUE(torch::equal(t, reference));
      EXPECT_TRUE(torch::equal(t, expected_sum(n, dtype)));
    }
  }
}

// One call per tensor, and the whole tensor's bytes as an all-reduce of it counts them (a
// staged bf16 tensor: its fp32 buffer's); neither touches the other counters.
TEST_F(Mpi, ShardedCollectivesAreCountedInStats) {
  auto f = rank_values(1000, rank_, torch::kFloat);
  comm_->reduce_scatter_sum_async(f)->wait();
  comm_->allgather_async(f)->wait();
  EXPECT_EQ(comm_->stats().reduce_scatter_calls, 1);
  EXPECT_EQ(comm_->stats().reduce_scatter_bytes, 4000);
  EXPECT_EQ(comm_->stats().allgather_calls, 1);
  EXPECT_EQ(comm_->stats().allgather_bytes, 4000);
  EXPECT_EQ(comm_->stats().allreduce_calls, 0);
  EXPECT_EQ(comm_->stats().allreduce_bytes, 0);
  EXPECT_EQ(comm_->stats().broadcast_calls, 0);

  int64_t calls = 1, bytes = 4000;
  for (auto dtype : kShardDtypes) {
    for (int64_t n : kShardSizes) {
      auto t = rank_values(n, rank_, dtype);
      comm_->reduce_scatter_sum_async(t)->wait();
      comm_->allgather_async(t)->wait();
      ++calls;
      bytes += n * (dtype == torch::kBFloat16 ? 4 : static_cast<int64_t>(c10::elementSize(dtype)));
    }
  }
  EXPECT_EQ(comm_->stats().reduce_scatter_calls, calls);
  EXPECT_EQ(comm_->stats().allgather_calls, calls);
  EXPECT_EQ(comm_->stats().reduce_scatter_bytes, bytes);
  EXPECT_EQ(comm_->stats().allgather_bytes, bytes);
  EXPECT_EQ(comm_->stats().allreduce_calls, 0);
  // The same tensors all-reduced count the same bytes.
  auto plain = make_comm();
  for (auto dtype : kShardDtypes)
    for (int64_t n : kShardSizes) {
      auto t = rank_values(n, rank_, dtype);
      plain->allreduce_sum(t);
    }
  EXPECT_EQ(plain->stats().allreduce_bytes + 4000, bytes);
}

// Several in flight at once (as gradient buckets are), mixed with an all-reduce, completed by
// test() polling and by wait() out of their start order.
TEST_F(Mpi, ShardedCollectivesManyInFlightWaitedOutOfOrder) {
  auto a = rank_values(1 << 16, rank_, torch::kFloat);  // reduce-scatter
  auto b = torch::full({10}, -1.0, torch::kDouble);     // all-gather
  lt::comm::shard_chunk(b, rank_, 2).copy_(lt::comm::shard_chunk(rank_values(10, rank_, torch::kDouble), rank_, 2));
  auto c = rank_values(1002, rank_, torch::kBFloat16);  // reduce-scatter, staged
  auto d = rank_values(300, rank_, torch::kLong);       // all-reduce
  auto e = torch::zeros({34}, torch::kBFloat16);        // all-gather, staged
  lt::comm::shard_chunk(e, rank_, 2).copy_(lt::comm::shard_chunk(rank_values(34, rank_, torch::kBFloat16), rank_, 2));
  std::vector<std::unique_ptr<lt::comm::Work>> work;
  work.push_back(comm_->reduce_scatter_sum_async(a));
  work.push_back(comm_->allgather_async(b));
  work.push_back(comm_->reduce_scatter_sum_async(c));
  work.push_back(comm_->allreduce_sum_async(d));
  work.push_back(comm_->allgather_async(e));
  EXPECT_EQ(comm_->stats().reduce_scatter_calls, 2);
  EXPECT_EQ(comm_->stats().allgather_calls, 2);
  EXPECT_EQ(comm_->stats().allreduce_calls, 1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!work[2]->test() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(work[2]->test()) << "a reduce-scatter polled with test() never completed";
  for (size_t k : {4, 0, 3, 1, 2}) work[k]->wait();
  EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(a, rank_, 2),
                           lt::comm::shard_chunk(expected_sum(1 << 16, torch::kFloat), rank_, 2)));
  EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(c, rank_, 2),
                           lt::comm::shard_chunk(expected_sum(1002, torch::kBFloat16), rank_, 2)));
  EXPECT_TRUE(torch::equal(d, expected_sum(300, torch::kLong)));
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(b, r, 2), lt::comm::shard_chunk(rank_values(10, r, torch::kDouble), r, 2)));
    EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(e, r, 2), lt::comm::shard_chunk(rank_values(34, r, torch::kBFloat16), r, 2)));
  }
  for (auto& w : work) EXPECT_TRUE(w->test());
}

// n not a multiple of the world size: std::invalid_argument naming both sizes, on every rank,
// before anything is started or counted (so the ranks stay in step).
TEST_F(Mpi, ShardedCollectivesRejectSizesThatDoNotSplitEvenly) {
  for (int64_t n : {1, 7, 1001}) {
    SCOPED_TRACE(n);
    auto t = rank_values(n, rank_, torch::kFloat);
    for (bool reduce_scatter : {true, false}) {
      try {
        if (reduce_scatter)
          comm_->reduce_scatter_sum_async(t);
        else
          comm_->allgather_async(t);
        ADD_FAILURE() << (reduce_scatter ? "reduce_scatter_sum_async" : "allgather_async") << " did not throw";
      } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::to_string(n) + " elements"), std::string::npos) << what;
        EXPECT_NE(what.find("2 equal chunks"), std::string::npos) << what;
      }
    }
  }
  const auto& s = comm_->stats();
  EXPECT_EQ(s.reduce_scatter_calls + s.allgather_calls + s.reduce_scatter_bytes + s.allgather_bytes, 0);
  // The ranks are still in step: a collective after the refusals completes.
  auto ok = rank_values(4, rank_, torch::kFloat);
  comm_->reduce_scatter_sum_async(ok)->wait();
  EXPECT_TRUE(torch::equal(lt::comm::shard_chunk(ok, rank_, 2), lt::comm::shard_chunk(expected_sum(4, torch::kFloat), rank_, 2)));
}

TEST_F(Mpi, BroadcastFromEachRoot) {
  for (int root : {0, 1}) {
    SCOPED_TRACE("root " + std::to_string(root));
    for (auto dtype : {torch::kFloat, torch::kLong, torch::kBFloat16}) {
      auto t = (torch::arange(15, torch::kDouble).view({5, 3}) + 100 * rank_).to(dtype);
      comm_->broadcast(t, root);
      EXPECT_EQ(t.sizes(), (std::vector<int64_t>{5, 3}));
      EXPECT_TRUE(torch::equal(t, (torch::arange(15, torch::kDouble).view({5, 3}) + 100 * root).to(dtype)))
          << c10::toString(dtype) << " on rank " << rank_ << ": " << t;
    }
  }
  EXPECT_EQ(comm_->stats().broadcast_calls, 6);
}

TEST_F(Mpi, AllgatherReturnsEveryRanksTensorInRankOrder) {
  for (auto dtype : {torch::kFloat, torch::kInt, torch::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto mine = (torch::arange(6, torch::kDouble).view({2, 3}) + 10 * rank_).to(dtype);
    const auto parts = comm_->allgather(mine);
    ASSERT_EQ(parts.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(parts[r].scalar_type(), dtype);
      EXPECT_TRUE(torch::equal(parts[r], (torch::arange(6, torch::kDouble).view({2, 3}) + 10 * r).to(dtype)))
          << "part " << r << " on rank " << rank_ << ": " << parts[r];
    }
    EXPECT_TRUE(torch::equal(parts[rank_], mine));
  }
}

TEST_F(Mpi, BarrierWaitsForTheSlowestRank) {
  comm_->barrier();  // both ranks leave this one at about the same time
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::now();
  if (rank_ == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  comm_->barrier();
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  // Rank 0 cannot leave before rank 1 has arrived, 0.5 s later.
  if (rank_ == 0) EXPECT_GE(waited, 0.4);
  EXPECT_LT(waited, 10.0);
}

// Passes (skipped) unless LEANTRAIN_MPI_TEST_FAIL_RANK names a rank, and fails on that rank
// only: the check that one rank's failure fails the whole job (tests/mpi/CMakeLists.txt).
TEST(MpiHarness, FailsOnTheRankNamedByTheEnvironment) {
  const char* fail_rank = std::getenv("LEANTRAIN_MPI_TEST_FAIL_RANK");
  if (fail_rank == nullptr) GTEST_SKIP() << "LEANTRAIN_MPI_TEST_FAIL_RANK not set";
  EXPECT_NE(lt::detect_world().rank, std::atoi(fail_rank)) << "failing on purpose (LEANTRAIN_MPI_TEST_FAIL_RANK)";
}

// On ranks other than 0: only failures, each line prefixed with the rank.
class RankFailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!r.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.message());
  }
  void OnTestEnd(const ::testing::TestInfo& t) override {
    if (t.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, t.test_suite_name(), t.name());
  }

 private:
  int rank_;
};

// Rank 0 waits in a collective under a 1 s deadline that rank 1 never joins (it sleeps, then
// would exit 0): the communicator must report it and end the job with exit code 3. The
// collective is a barrier, or (`reduce-scatter`) the wait() of a reduce-scatter of 1000 floats.
int miss_a_deadline(const std::string& collective) {
  auto comm = make_comm();
  comm->set_step(7);
  comm->set_timeout(1.0);
  if (comm->rank() == 0) {
    if (collective == "reduce-scatter")
      comm->reduce_scatter_sum_async(torch::ones({1000}))->wait();  // never returns: MPI_Abort(3)
    else
      comm->barrier();  // never returns: MPI_Abort(3)
    std::fprintf(stderr, "the %s returned without rank 1\n", collective.c_str());
    return 1;
  }
  std::this_thread::sleep_for(std::chrono::seconds(60));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  torch::set_num_threads(1);  // two ranks share the machine
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--miss-a-deadline") == 0) return miss_a_deadline("barrier");
    if (std::strncmp(argv[i], "--miss-a-deadline=", 18) == 0) return miss_a_deadline(argv[i] + 18);
  }

  ::testing::InitGoogleTest(&argc, argv);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(rank));
  }
  const int local_ok = RUN_ALL_TESTS() == 0 ? 1 : 0;

  // The job passes only if every rank passed.
  int all_ok = 0;
  MPI_Allreduce(&local_ok, &all_ok, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  std::vector<int> oks(static_cast<size_t>(size), 0);
  MPI_Gather(&local_ok, 1, MPI_INT, oks.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    std::fprintf(stderr, "[mpi] %d ranks:", size);
    for (int r = 0; r < size; ++r) std::fprintf(stderr, " rank %d %s%s", r, oks[r] ? "passed" : "FAILED", r + 1 < size ? "," : "\n");
    std::fprintf(stderr, "[mpi] %s\n", all_ok ? "PASSED on every rank" : "FAILED");
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
