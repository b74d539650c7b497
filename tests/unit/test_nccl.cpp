// The NCCL backend: backend selection (a pure function, no GPU needed), the dtype mapping,
// that the public header keeps NCCL and CUDA out, and — on a machine with a CUDA device — a
// world-of-one NCCL communicator: values, stream ordering, async work, and the deadline abort.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "leantrain/comm/communicator.h"
#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/comm/nccl_communicator.h"
#include "leantrain/runtime/errors.h"

// The public header must not drag NCCL or the CUDA runtime into its includers.
#if defined(NCCL_MAJOR) || defined(__CUDA_RUNTIME_H__)
#error "leantrain/comm/nccl_communicator.h leaks nccl.h or cuda_runtime.h"
#endif

#ifdef LEANTRAIN_HAVE_NCCL
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <nccl.h>
#endif

namespace {

using lt::comm::choose_backend;

// ---------------------------------------------------------------- backend selection

TEST(BackendChoice, AutoIsLocalForAWorldOfOne) {
  EXPECT_EQ(choose_backend("auto", 1, false, true), "local");
  EXPECT_EQ(choose_backend("auto", 1, true, true), "local");
  EXPECT_EQ(choose_backend("auto", 1, true, false), "local");
}

TEST(BackendChoice, AutoIsNcclOnCudaWhenBuiltElseMpi) {
  EXPECT_EQ(choose_backend("auto", 4, true, true), "nccl");
  EXPECT_EQ(choose_backend("auto", 4, true, false), "mpi");
  EXPECT_EQ(choose_backend("auto", 4, false, true), "mpi");
  EXPECT_EQ(choose_backend("auto", 2, false, false), "mpi");
}

TEST(BackendChoice, MpiAlwaysWorks) {
  for (int world : {1, 3})
    for (bool cuda : {false, true})
      for (bool built : {false, true}) EXPECT_EQ(choose_backend("mpi", world, cuda, built), "mpi");
}

TEST(BackendChoice, NcclNeedsCudaAndNccl) {
  EXPECT_EQ(choose_backend("nccl", 2, true, true), "nccl");
  EXPECT_EQ(choose_backend("nccl", 1, true, true), "nccl");
  try {
    choose_backend("nccl", 2, false, true);
    FAIL() << "nccl on the CPU must be a ConfigError";
  } catch (const lt::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("comm.backend"), std::string::npos) << m;
    EXPECT_NE(m.find("train.device"), std::string::npos) << m;  // the fix
    EXPECT_NE(m.find("'mpi'"), std::string::npos) << m;
  }
  try {
    choose_backend("nccl", 2, true, false);
    FAIL() << "nccl without NCCL built must be a ConfigError";
  } catch (const lt::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("comm.backend"), std::string::npos) << m;
    EXPECT_NE(m.find("without NCCL"), std::string::npos) << m;
  }
}

TEST(BackendChoice, LocalOnlyForAWorldOfOneAndUnknownNamesRejected) {
  EXPECT_EQ(choose_backend("local", 1, true, true), "local");
  EXPECT_THROW(choose_backend("local", 2, false, false), lt::ConfigError);
  EXPECT_THROW(choose_backend("gloo", 2, false, false), lt::ConfigError);
}

TEST(MakeCommunicator, WorldOfOneAutoIsLocalAndNcclOnCpuFailsBeforeAnyMpi) {
  lt::CommConfig cfg;
  lt::RuntimeContext ctx;  // CPU, world of one
  cfg.backend = "auto";
  EXPECT_EQ(lt::comm::make_communicator(cfg, ctx)->backend(), "local");
  cfg.backend = "nccl";
  EXPECT_THROW(lt::comm::make_communicator(cfg, ctx), lt::ConfigError);
}

// ---------------------------------------------------------------- dtype mapping

TEST(NcclDataType, EveryReducibleTypeMapsToItsNcclType) {
  if (!lt::comm::nccl_built()) GTEST_SKIP() << "built without NCCL";
#ifdef LEANTRAIN_HAVE_NCCL
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kFloat), ncclFloat32);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kDouble), ncclFloat64);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kHalf), ncclFloat16);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kBFloat16), ncclBfloat16);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kChar), ncclInt8);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kByte), ncclUint8);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kInt), ncclInt32);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kLong), ncclInt64);
  // A sum of bools is not what NCCL would compute; complex has no NCCL type.
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kBool), -1);
  EXPECT_EQ(lt::comm::nccl_data_type(torch::kComplexFloat), -1);
#endif
}

TEST(NcclCommunicatorCpu, WithoutADeviceItIsAClearError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a CUDA device is visible";
  // Built with NCCL, no driver (this CI machine), or built without NCCL: never a crash.
  try {
    lt::comm::NcclCommunicator comm(5.0, "testhost", 0);
    FAIL() << "an NCCL communicator without a CUDA device";
  } catch (const lt::ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("comm.backend"), std::string::npos) << m;
    EXPECT_NE(m.find("testhost"), std::string::npos) << m;
  }
}

// ---------------------------------------------------------------- on a CUDA device

#ifdef LEANTRAIN_HAVE_NCCL

// MPI is initialised once per process (it cannot be again after MPI_Finalize): an
// MpiCommunicator made first owns it, so the NCCL communicators made after it do not; it is
// finalised after the last test.
class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { mpi.reset(); }
  std::unique_ptr<lt::comm::MpiCommunicator> mpi;
};
auto* const g_mpi_env = static_cast<MpiEnvironment*>(::testing::AddGlobalTestEnvironment(new MpiEnvironment));

void process_mpi() {
  if (!g_mpi_env->mpi) g_mpi_env->mpi = std::make_unique<lt::comm::MpiCommunicator>(60.0, "testhost");
}

bool have_gpu() { return lt::comm::nccl_built() && torch::cuda::is_available(); }

std::unique_ptr<lt::comm::NcclCommunicator> make_nccl(double timeout_s) {
  process_mpi();
  return std::make_unique<lt::comm::NcclCommunicator>(timeout_s, "testhost", 0);
}

torch::TensorOptions cuda(torch::ScalarType t) { return torch::TensorOptions().device(torch::kCUDA, 0).dtype(t); }

TEST(NcclWorldOfOne, AllReduceKeepsValuesOfEveryTypeAndCounts) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto comm = make_nccl(60.0);
  EXPECT_EQ(comm->backend(), "nccl");
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  torch::manual_seed(1);
  int64_t calls = 0, bytes = 0;
  for (auto type : {torch::kFloat, torch::kDouble, torch::kHalf, torch::kBFloat16, torch::kInt, torch::kLong}) {
    auto t = (torch::randn({1000}, cuda(torch::kFloat)) * 100).to(type);
    auto expect = t.cpu();
    comm->allreduce_sum(t);
    ++calls;
    bytes += static_cast<int64_t>(t.nbytes());
    EXPECT_TRUE(torch::equal(t.cpu(), expect)) << c10::toString(type);
  }
  // Non-contiguous: reduced through a buffer and written back.
  auto base = torch::randn({64, 32}, cuda(torch::kFloat));
  auto tr = base.t();
  auto expect = tr.cpu().clone();
  comm->allreduce_sum(tr);
  EXPECT_TRUE(torch::equal(base.t().cpu(), expect));
  EXPECT_EQ(comm->stats().allreduce_calls, calls + 1);
  EXPECT_EQ(comm->stats().allreduce_bytes, bytes + 64 * 32 * 4);
  auto flags = torch::zeros({3}, cuda(torch::kBool));
  EXPECT_THROW(comm->allreduce_sum(flags), std::invalid_argument);
}

TEST(NcclWorldOfOne, ManyMixesCpuAndCudaTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto comm = make_nccl(60.0);
  std::vector<torch::Tensor> ts = {torch::arange(10, cuda(torch::kFloat)), torch::full({4}, 2.5, torch::kDouble),
                                   torch::arange(7, cuda(torch::kBFloat16)), torch::arange(5, torch::kLong)};
  std::vector<torch::Tensor> expect;
  for (auto& t : ts) expect.push_back(t.cpu().clone());
  comm->allreduce_sum_many(ts);
  for (size_t i = 0; i < ts.size(); ++i) EXPECT_TRUE(torch::equal(ts[i].cpu(), expect[i])) << i;
  EXPECT_EQ(comm->stats().allreduce_calls, 4);
}

TEST(NcclWorldOfOne, BroadcastAndAllgatherOfAnyType) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto comm = make_nccl(60.0);
  auto b = torch::tensor({true, false, true}, cuda(torch::kBool));  // bytes: any type travels
  comm->broadcast(b, 0);
  EXPECT_TRUE(torch::equal(b.cpu(), torch::tensor({true, false, true})));
  EXPECT_EQ(comm->stats().broadcast_calls, 1);
  auto x = torch::randn({3, 5}, cuda(torch::kHalf));
  auto parts = comm->allgather(x);
  ASSERT_EQ(parts.size(), 1u);
  EXPECT_EQ(parts[0].sizes(), x.sizes());
  EXPECT_TRUE(parts[0].is_cuda());
  EXPECT_TRUE(torch::equal(parts[0].cpu(), x.cpu()));
  auto cpu_parts = comm->allgather(torch::arange(4, torch::kLong));  // over MPI
  ASSERT_EQ(cpu_parts.size(), 1u);
  EXPECT_TRUE(torch::equal(cpu_parts[0], torch::arange(4, torch::kLong)));
  comm->barrier();
}

// Note [Stream handoff] checked where it can be seen in a world of one: all-gather copies out
// of place, so it reads the input after the caller's stream wrote it (a fill queued behind a
// ~50 ms spin), and the caller's stream reads the output only after NCCL wrote it. The
// caller's stream is a side stream, not the default one: the handoff must use the current one.
TEST(NcclWorldOfOne, CollectivesAreOrderedOnTheCallersCurrentStream) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto comm = make_nccl(60.0);
  auto side = c10::cuda::getStreamFromPool(false, 0);
  c10::cuda::CUDAStreamGuard guard(side);
  for (int round = 0; round < 3; ++round) {
    auto x = torch::zeros({1 << 20}, cuda(torch::kFloat));
    at::cuda::sleep(100'000'000);  // ~50 ms of GPU time on the side stream
    x.fill_(static_cast<float>(round + 7));
    auto parts = comm->allgather(x);
    auto y = parts[0] * 2;  // on the side stream, after NCCL's copy
    EXPECT_EQ(y.min().item<float>(), 2.0f * (round + 7)) << "round " << round;
    EXPECT_EQ(y.max().item<float>(), 2.0f * (round + 7)) << "round " << round;
  }
}

TEST(NcclWorldOfOne, AsyncAllReduceCompletesWithoutAHostSync) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  auto comm = make_nccl(60.0);
  auto t = torch::randn({1 << 16}, cuda(torch::kFloat));
  auto expect = t.cpu();
  comm->allreduce_sum(t);  // warm-up: NCCL's kernels load lazily on first use
  torch::cuda::synchronize();
  at::cuda::sleep(400'000'000);  // ~200 ms: the collective cannot have finished on return
  const auto t0 = std::chrono::steady_clock::now();
  auto work = comm->allreduce_sum_async(t);
  EXPECT_FALSE(work->test());
  work->wait();  // orders the stream; returns before the GPU is done
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(waited, 0.1) << "wait() blocked the host";
  EXPECT_TRUE(torch::equal(t.cpu(), expect));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!work->test() && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
  EXPECT_TRUE(work->test());
  EXPECT_EQ(comm->stats().allreduce_calls, 2);
}

// A collective stuck behind ~3 s of GPU work with a 0.5 s deadline: the watchdog names it
// and ends the process with the deadline's exit code (3), while the host is blocked in a sync.
TEST(NcclWorldOfOneDeathTest, MissedDeadlineAbortsWithExitCode3) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // a fresh process: CUDA and threads are up
  EXPECT_EXIT(
      {
        auto comm = make_nccl(60.0);  // setup (ncclCommInitRank) under a generous deadline
        comm->set_timeout(0.5);
        comm->set_step(42);
        auto t = torch::ones({1024}, cuda(torch::kFloat));
        at::cuda::sleep(6'000'000'000LL);
        comm->allreduce_sum(t);
        torch::cuda::synchronize();
        std::exit(0);  // not reached
      },
      ::testing::ExitedWithCode(lt::kExitCollectiveTimeout),
      "collective NCCL all-reduce \\(4096 bytes\\) at step 42 on rank 0 host testhost did not complete "
      "within 0.5[0-9]* s \\(comm.timeout_s");
}

TEST(NcclWorldOfOne, MakeCommunicatorPicksNcclOnCuda) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  process_mpi();
  lt::CommConfig cfg;
  lt::RuntimeContext ctx;
  ctx.device_index = 0;
  cfg.backend = "auto";
  EXPECT_EQ(lt::comm::make_communicator(cfg, ctx)->backend(), "local");  // a world of one
  cfg.backend = "nccl";
  EXPECT_EQ(lt::comm::make_communicator(cfg, ctx)->backend(), "nccl");
}

#endif  // LEANTRAIN_HAVE_NCCL

}  // namespace
