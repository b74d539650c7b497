// The NCCL backend: CUDA tensors over NCCL on a stream of its own, CPU tensors (and the
// bootstrap, and the barrier) over the MPI backend, as Horovod mixes NCCL and MPI. Every
// collective on the NCCL stream is watched: a watchdog thread polls its completion event and
// ncclCommGetAsyncError, and a collective that misses comm.timeout_s, or an asynchronous NCCL
// error, is reported and ends the job (ncclCommAbort, then MPI_Abort) — the nccl-tests and
// c10d watchdog. Without the CUDA toolkit at build time the class only throws.
#include "leantrain/comm/nccl_communicator.h"

#include <string>

#include "leantrain/runtime/errors.h"

#ifdef LEANTRAIN_HAVE_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "abort_once.h"
#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/runtime/log.h"
#endif

namespace lt::comm {

#ifndef LEANTRAIN_HAVE_NCCL

bool nccl_built() { return false; }
int nccl_data_type(torch::ScalarType) { return -1; }

struct NcclCommunicator::Impl {};

NcclCommunicator::NcclCommunicator(double, std::string host, int) {
  throw ConfigError("comm.backend = 'nccl' on host " + host +
                    ": this leantrain was built without NCCL (no CUDA toolkit found at build time); use "
                    "comm.backend = 'mpi' or 'auto', or rebuild with the CUDA toolkit and NCCL installed");
}
NcclCommunicator::~NcclCommunicator() = default;
int NcclCommunicator::rank() const { return 0; }
int NcclCommunicator::size() const { return 1; }
void NcclCommunicator::allreduce_sum(torch::Tensor&) {}
void NcclCommunicator::allreduce_sum_many(std::vector<torch::Tensor>&) {}
std::unique_ptr<Work> NcclCommunicator::allreduce_sum_async(torch::Tensor) { return std::make_unique<CompletedWork>(); }
void NcclCommunicator::set_timeout(double) {}
void NcclCommunicator::broadcast(torch::Tensor&, int) {}
std::vector<torch::Tensor> NcclCommunicator::allgather(const torch::Tensor& t) { return {t}; }
std::unique_ptr<Work> NcclCommunicator::reduce_scatter_sum_async(torch::Tensor) { return std::make_unique<CompletedWork>(); }
std::unique_ptr<Work> NcclCommunicator::allgather_async(torch::Tensor) { return std::make_unique<CompletedWork>(); }
void NcclCommunicator::barrier() {}
void NcclCommunicator::abort(int) {}

#else  // LEANTRAIN_HAVE_NCCL

bool nccl_built() { return true; }

int nccl_data_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return ncclFloat32;
    case torch::kDouble: return ncclFloat64;
    case torch::kHalf: return ncclFloat16;
    case torch::kBFloat16: return ncclBfloat16;
    case torch::kChar: return ncclInt8;
    case torch::kByte: return ncclUint8;
    case torch::kInt: return ncclInt32;
    case torch::kLong: return ncclInt64;
    default: return -1;  // bool (a sum is not an "or"), complex, float8: no NCCL sum
  }
}

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Note [NCCL watchdog]
// A collective on the NCCL stream is one Pending: the event recorded on the NCCL stream after
// it, what it was, its bytes, the step, and the deadline in force when it started (a later
// set_timeout does not move it). The watchdog thread polls every pending event (cudaEventQuery)
// and the communicator's ncclCommGetAsyncError every kWatchdogPoll; Work::test()/wait() poll
// the same. The deadline counts from the host enqueue, as c10d's does, so it includes the GPU
// work queued before the collective on the caller's stream: comm.timeout_s must cover a step.
// When one is late, or NCCL reports an asynchronous error (a peer's connection died, a remote
// error), the job cannot go on: the collective is named in the log (collective, bytes, rank,
// host, comm.timeout_s), the communicator is aborted (ncclCommAbort: the NCCL kernels exit
// and nothing waits on the dead peer any more), then MPI_Abort(MPI_COMM_WORLD, 3) ends every
// rank with the MPI backend's exit code. The watchdog does this itself, from its own thread:
// the main thread may be blocked in a host sync (loss.item()) behind the stuck kernel and
// would never get to look. Open MPI's MPI_Abort only asks the local daemon to kill the job,
// which works from any thread (the MPI backend initialises MPI_THREAD_SERIALIZED: MPI calls
// come from one thread at a time — the main thread, or the autograd engine's device thread
// in a gradient hook — and none from the watchdog but this MPI_Abort). The watchdog also
// covers the host calls that can block on peers: ncclCommInitRank (until every rank has
// joined) and each enqueue (NCCL connects two ranks lazily, inside the first collective
// between them). Which thread may touch the communicator, and which one ends it (exactly
// once), is Note [NCCL communicator lifetime] (abort_once.h).
constexpr auto kWatchdogPoll = std::chrono::milliseconds(100);
// How long an abort waits for an NCCL call in flight on another thread to return before it
// aborts under it (that call is then blocked on a peer: Note [NCCL communicator lifetime]).
constexpr auto kAbortGrace = std::chrono::milliseconds(2000);

[[noreturn]] void park() {
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

struct Pending {
  cudaEvent_t done = nullptr;  // recorded on the NCCL stream after the collective
  std::string what;
  int64_t bytes = 0;
  int64_t step = 0;
  double timeout_s = 0;
  Clock::time_point start = Clock::now();
  bool collective = true;  // false: a blocking setup call (ncclCommInitRank)
  std::atomic<bool> completed{false};

  Pending() = default;
  Pending(const Pending&) = delete;
  Pending& operator=(const Pending&) = delete;
  ~Pending() {
    if (done) cudaEventDestroy(done);  // legal before completion: freed once it completes
  }
};

}  // namespace

struct NcclCommunicator::Impl {
  std::unique_ptr<MpiCommunicator> mpi;  // bootstrap, CPU tensors, barrier; destroyed last
  std::string host;
  int rank = 0, size = 1, device = 0;
  std::atomic<double> timeout_s{300.0};
  int64_t step = 0;  // mirrored from the Communicator before each collective
  // The communicator's one owner: used by one call at a time, polled only while running,
  // ended (ncclCommAbort or ncclCommDestroy) exactly once (Note [NCCL communicator lifetime]).
  AbortOnce<ncclComm_t> life;
  cudaStream_t stream = nullptr;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::shared_ptr<Pending>> pending;  // guarded by mu
  std::shared_ptr<Pending> blocking;             // a blocking host call under watch; guarded by mu
  bool stopping = false;                         // guarded by mu
  std::atomic<bool> failing{false};  // set first by fail() and abort(): the job is ending
  std::thread watchdog;

  ~Impl();

  std::string where() const { return "rank " + std::to_string(rank) + " host " + host; }

  // Aborts the communicator unless another thread has ended it or is ending it (then it is
  // not touched: that thread aborts it, once). Never waits for that other thread: it may be
  // joining the watchdog, which may be the caller.
  void abort_comm() {
    life.end_once(
        [](ncclComm_t c) {
          if (c) ncclCommAbort(c);
        },
        kAbortGrace);
  }

  // Reports, aborts the communicator and ends the job. Never returns; a second caller (the
  // main thread and the watchdog racing) waits for the first one's MPI_Abort.
  [[noreturn]] void fail(const std::string& msg) {
    if (failing.exchange(true)) park();
    lt::log::error(msg);
    abort_comm();
    MPI_Abort(MPI_COMM_WORLD, kExitCollectiveTimeout);
    std::_Exit(kExitCollectiveTimeout);  // MPI_Abort does not return; if it did, still end
  }

  // The communicator was ended by another call: while the job is ending (fail() or abort()
  // on another thread) wait for its MPI_Abort; else (a synchronous NCCL error before) throw.
  [[noreturn]] void ended_elsewhere() const {
    if (failing.load()) park();
    throw std::runtime_error("the NCCL communicator on " + where() +
                             " was aborted after an earlier error; no collective can run");
  }

  // An asynchronous NCCL error on the communicator ends the job (Note [NCCL watchdog]). The
  // query is skipped while another thread is inside an NCCL call (its deadline is watched)
  // and once the communicator is being ended.
  void check_async(const Pending* in_flight) {
    ncclResult_t async = ncclSuccess;
    std::string last;
    life.try_use([&](ncclComm_t c) {
      const ncclResult_t r = ncclCommGetAsyncError(c, &async);
      if (r != ncclSuccess) async = r;
      if (async != ncclSuccess && async != ncclInProgress) last = ncclGetLastError(c);
    });
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::string during = in_flight ? " during " + in_flight->what + " (" + std::to_string(in_flight->bytes) +
                                         " bytes, step " + std::to_string(in_flight->step) + ")"
                                   : "";
    fail("NCCL reported an asynchronous error on " + where() + during + ": " + ncclGetErrorString(async) + " (" +
         last + "); a peer rank or its network link failed; aborting the job");
  }

  // True once `p` completed; ends the job when it is past its deadline or CUDA failed.
  bool poll(Pending& p) {
    if (p.completed.load()) return true;
    const cudaError_t q = cudaEventQuery(p.done);
    if (q == cudaSuccess) {
      p.completed = true;
      return true;
    }
    if (q != cudaErrorNotReady)
      fail("CUDA error while NCCL " + p.what + " (" + std::to_string(p.bytes) + " bytes, step " +
           std::to_string(p.step) + ") was in flight on " + where() + ": " + cudaGetErrorString(q) +
           "; aborting the job");
    if (seconds_since(p.start) > p.timeout_s) late(p);
    return false;
  }

  [[noreturn]] void late(const Pending& p) {
    if (!p.collective)
      fail(p.what + " on " + where() + " did not complete within " + std::to_string(p.timeout_s) +
           " s (comm.startup_timeout_s): a peer rank did not join or is stuck; aborting the job");
    // The MPI backend's wording (comm/src/mpi_deadline.cpp), with NCCL named.
    fail("collective NCCL " + p.what + " (" + std::to_string(p.bytes) + " bytes) at step " + std::to_string(p.step) +
         " on " + where() + " did not complete within " + std::to_string(p.timeout_s) +
         " s (comm.timeout_s, or comm.startup_timeout_s for setup and the step after an evaluation or a "
         "checkpoint): a peer rank is dead or stuck, or the GPU work queued before it outlasted the deadline; "
         "aborting the job");
  }

  // A host call that may block on peers (NCCL connects lazily, inside the first collective
  // between two ranks) is watched while it runs.
  void watch_blocking(std::shared_ptr<Pending> p) {
    std::lock_guard<std::mutex> lk(mu);
    blocking = std::move(p);
  }

  void watch() {
    cudaSetDevice(device);  // events and the communicator live on this device
    std::unique_lock<std::mutex> lk(mu);
    while (!stopping) {
      cv.wait_for(lk, kWatchdogPoll);
      if (stopping) break;
      auto snapshot = pending;
      auto b = blocking;
      lk.unlock();
      check_async(snapshot.empty() ? nullptr : snapshot.front().get());
      for (auto& p : snapshot) poll(*p);
      if (b && seconds_since(b->start) > b->timeout_s) late(*b);
      lk.lock();
      pending.erase(std::remove_if(pending.begin(), pending.end(), [](const auto& p) { return p->completed.load(); }),
                    pending.end());
    }
  }

  void stop_watchdog() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stopping = true;
    }
    cv.notify_all();
    if (watchdog.joinable()) watchdog.join();
  }

  // A synchronous NCCL failure: abort the communicator, then throw (Horovod's order). Never
  // called inside life.use() (end_once would wait its grace for that very use).
  void nccl_check(ncclResult_t r, const std::string& what) {
    if (r == ncclSuccess) return;
    watch_blocking(nullptr);
    std::string detail = ncclGetErrorString(r);
    const bool ended_here = life.end_once(
        [&](ncclComm_t c) {
          if (!c) return;  // before ncclCommInitRank succeeded: nothing to abort
          detail += std::string(" (") + ncclGetLastError(c) + ")";
          stop_watchdog();  // a broken communicator is watched no more (nor polled: not running)
          ncclCommAbort(c);
        },
        kAbortGrace);
    if (!ended_here) ended_elsewhere();  // the watchdog's fail() got there first
    throw std::runtime_error("NCCL " + what + " failed on " + where() + ": " + detail +
                             "; the NCCL communicator was aborted (see NCCL_DEBUG=WARN for details)");
  }

  void cuda_check(cudaError_t r, const std::string& what) const {
    if (r != cudaSuccess)
      throw std::runtime_error("CUDA " + what + " failed on " + where() + " (cuda:" + std::to_string(device) +
                               "): " + cudaGetErrorString(r));
  }

  void usable() const {
    if (!life.usable()) ended_elsewhere();
  }

  // The CUDA tensor's checks: on this rank's device; a type NCCL can sum (for reductions).
  void check_tensor(const torch::Tensor& t, const char* what, bool reduce) const {
    if (t.device().index() != device)
      throw std::invalid_argument(std::string(what) + " of a tensor on " + t.device().str() + " on " + where() +
                                  ": this rank's NCCL communicator is on cuda:" + std::to_string(device) +
                                  "; move the tensor to the run's device first");
    if (reduce && nccl_data_type(t.scalar_type()) < 0)
      throw std::invalid_argument(std::string(what) + " of a " + std::string(c10::toString(t.scalar_type())) +
                                  " CUDA tensor on " + where() +
                                  ": NCCL cannot sum this type; convert it to float, double or an integer type");
  }

  // Note [Stream handoff]
  // No host sync before or after NCCL work (llm.c's multi_gpu_async_reduce_gradient, c10d):
  //   1. an event recorded on the caller's current stream, which the NCCL stream waits for:
  //      the collective starts once everything queued before it (the backward pass that wrote
  //      the gradients) has run, and compute queued later overlaps with it;
  //   2. the collectives, grouped (one ncclGroupStart/End for a list of buckets);
  //   3. an event recorded on the NCCL stream after them (the watchdog's Pending::done);
  //   4. at Work::wait(), the caller's current stream waits for that event: what is queued on
  //      it later sees the result.
  // The tensors are recorded on the NCCL stream in the caching allocator (c10d's recordStream)
  // so a tensor freed before wait() is not handed out again while NCCL still writes it.
  // `issue(comm)` makes the NCCL calls of step 2 and returns the first failure; it runs as
  // the communicator's one use in flight (Note [NCCL communicator lifetime]).
  template <class Issue>
  std::shared_ptr<Pending> launch(const std::string& what, int64_t bytes, const std::vector<torch::Tensor>& tensors,
                                  Issue&& issue) {
    usable();
    cudaStream_t compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    cudaEvent_t ready = nullptr;
    cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaEventRecord(ready, compute), "cudaEventRecord");
    const cudaError_t w = cudaStreamWaitEvent(stream, ready, 0);
    cudaEventDestroy(ready);  // released once recorded work completes
    cuda_check(w, "cudaStreamWaitEvent");

    auto p = std::make_shared<Pending>();
    p->what = what;
    p->bytes = bytes;
    p->step = step;
    p->timeout_s = timeout_s.load();
    cuda_check(cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming), "cudaEventCreate");
    watch_blocking(p);
    ncclResult_t r = ncclSuccess;
    const bool ran = life.use([&](ncclComm_t c) {
      r = ncclGroupStart();
      if (r != ncclSuccess) return;
      r = issue(c);
      const ncclResult_t end = ncclGroupEnd();  // closes the group after a failed call too
      if (r == ncclSuccess) r = end;
    });
    watch_blocking(nullptr);
    if (!ran) ended_elsewhere();  // ended while this thread waited for its turn
    nccl_check(r, what);
    cuda_check(cudaEventRecord(p->done, stream), "cudaEventRecord");
    const auto nccl_stream = c10::cuda::getStreamFromExternal(stream, static_cast<c10::DeviceIndex>(device));
    for (const auto& t : tensors)
      if (t.defined() && t.numel() > 0) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), nccl_stream);
    {
      std::lock_guard<std::mutex> lk(mu);
      pending.push_back(p);
    }
    return p;
  }

  // The caller's current stream waits for `p` (step 4 of Note [Stream handoff]).
  void order_after(Pending& p) {
    check_async(&p);
    if (poll(p)) return;  // already done: nothing to wait for
    cudaStream_t compute = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
    cuda_check(cudaStreamWaitEvent(compute, p.done, 0), "cudaStreamWaitEvent");
  }
};

NcclCommunicator::Impl::~Impl() {
  // Let queued NCCL work finish under the watchdog's eye, unless we are unwinding from an
  // error (a peer may never join the collective we would wait on: abort instead).
  const bool unwinding = std::uncaught_exceptions() > 0;
  if (life.usable() && stream && !unwinding) cudaStreamSynchronize(stream);
  stop_watchdog();
  pending.clear();
  blocking.reset();
  // Unless an error ended it already (then it is not touched again).
  life.end_once([unwinding](ncclComm_t c) {
    if (!c) return;
    if (unwinding)
      ncclCommAbort(c);
    else
      ncclCommDestroy(c);
  });
  if (stream) cudaStreamDestroy(stream);
  mpi.reset();
}

namespace {

// A Work on the NCCL stream: test() polls, wait() orders the caller's stream after it and
// copies non-contiguous results back (on that stream, after the collective).
class NcclWork final : public Work {
 public:
  NcclWork(NcclCommunicator::Impl& impl, std::shared_ptr<Pending> p, std::vector<torch::Tensor> keep,
           std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back)
      : impl_(impl), p_(std::move(p)), keep_(std::move(keep)), copy_back_(std::move(copy_back)) {}

  bool test() override {
    if (waited_) return true;
    impl_.check_async(p_.get());
    return impl_.poll(*p_);
  }

  void wait() override {
    if (waited_) return;
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(impl_.device));
    impl_.order_after(*p_);
    for (auto& [dst, src] : copy_back_) dst.copy_(src);
    waited_ = true;
    keep_.clear();
    copy_back_.clear();
  }

  // Note [Buckets in flight on a GPU] (grad_sync.cpp): the host waits for the collective's
  // completion event, polling as test() does, so that NCCL's asynchronous errors and the
  // watchdog's deadline still end a stuck wait; then wait() as usual.
  void wait_host() override {
    while (!impl_.poll(*p_)) {
      impl_.check_async(p_.get());
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    wait();
  }

 private:
  NcclCommunicator::Impl& impl_;
  std::shared_ptr<Pending> p_;
  std::vector<torch::Tensor> keep_;  // alive until wait(): NCCL reads and writes them
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back_;  // (caller's tensor, contiguous buffer)
  bool waited_ = false;
};

}  // namespace

NcclCommunicator::NcclCommunicator(double timeout_s, std::string host, int device_index)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  // The device first: a CPU machine gets a clear error before MPI is touched.
  int n = 0;
  const cudaError_t dc = cudaGetDeviceCount(&n);
  if (dc != cudaSuccess || n == 0)
    throw ConfigError("comm.backend = 'nccl' on host " + host + ": no usable CUDA device (" +
                      (dc != cudaSuccess ? std::string(cudaGetErrorString(dc)) : std::string("none visible")) +
                      "); use comm.backend = 'mpi' or 'auto' on machines without GPUs");
  if (device_index < 0 || device_index >= n)
    throw ConfigError("comm.backend = 'nccl' on host " + host + ": CUDA device " + std::to_string(device_index) +
                      " does not exist (" + std::to_string(n) + " visible); set train.device = cuda");
  m.host = host;
  m.timeout_s = timeout_s;
  m.device = device_index;
  m.mpi = std::make_unique<MpiCommunicator>(timeout_s, std::move(host));
  m.rank = m.mpi->rank();
  m.size = m.mpi->size();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));

  // Rank 0 makes the unique id; MPI carries it to every rank (under the MPI deadline).
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  auto id_t = torch::zeros({static_cast<int64_t>(sizeof(id))}, torch::kByte);
  if (m.rank == 0) {
    m.nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    std::memcpy(id_t.data_ptr(), &id, sizeof(id));
  }
  m.mpi->broadcast(id_t, 0);
  std::memcpy(&id, id_t.data_ptr(), sizeof(id));

  int least = 0, greatest = 0;
  m.cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
  m.cuda_check(cudaStreamCreateWithPriority(&m.stream, cudaStreamNonBlocking, greatest), "cudaStreamCreate");

  m.watchdog = std::thread([&m] { m.watch(); });
  auto init = std::make_shared<Pending>();
  init->what = "NCCL communicator initialisation (ncclCommInitRank, " + std::to_string(m.size) + " ranks)";
  init->timeout_s = timeout_s;
  init->collective = false;
  m.watch_blocking(init);
  // Into a local: the watchdog may be ending the job meanwhile (this call's deadline).
  ncclComm_t comm = nullptr;
  const ncclResult_t r = ncclCommInitRank(&comm, m.size, id, m.rank);
  m.watch_blocking(nullptr);
  m.nccl_check(r, "ncclCommInitRank");  // on failure NCCL freed what it made: nothing to abort
  if (!m.life.publish(comm)) m.ended_elsewhere();  // the watchdog's fail() is ending the job
}

NcclCommunicator::~NcclCommunicator() = default;

int NcclCommunicator::rank() const { return impl_->rank; }
int NcclCommunicator::size() const { return impl_->size; }

void NcclCommunicator::set_timeout(double seconds) {
  impl_->timeout_s = seconds;
  impl_->mpi->set_timeout(seconds);
}

std::unique_ptr<Work> NcclCommunicator::allreduce_sum_async(torch::Tensor t) {
  auto& m = *impl_;
  if (t.is_cuda()) m.check_tensor(t, "all-reduce", true);
  ++stats_.allreduce_calls;
  stats_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
  if (!t.is_cuda()) return m.mpi->allreduce_sum_async(t);
  m.step = step();
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  auto buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
  if (!buf.is_same(t)) copy_back.emplace_back(t, buf);
  const auto type = static_cast<ncclDataType_t>(nccl_data_type(buf.scalar_type()));
  auto p = m.launch("all-reduce", static_cast<int64_t>(buf.nbytes()), {buf}, [&](ncclComm_t c) {
    if (buf.numel() == 0) return ncclSuccess;
    return ncclAllReduce(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(buf.numel()), type, ncclSum, c,
                         m.stream);
  });
  return std::make_unique<NcclWork>(m, std::move(p), std::vector<torch::Tensor>{buf}, std::move(copy_back));
}

void NcclCommunicator::allreduce_sum(torch::Tensor& t) {
  if (!t.is_cuda()) {
    ++stats_.allreduce_calls;
    stats_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
    impl_->mpi->allreduce_sum(t);
    return;
  }
  allreduce_sum_async(t)->wait();
}

void NcclCommunicator::allreduce_sum_many(std::vector<torch::Tensor>& tensors) {
  auto& m = *impl_;
  m.step = step();
  std::vector<torch::Tensor> cpu, cuda;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
  int64_t cuda_bytes = 0;
  for (auto& t : tensors) {
    stats_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
    if (!t.is_cuda()) {
      cpu.push_back(t);
      continue;
    }
    m.check_tensor(t, "all-reduce", true);
    auto buf = t.is_contiguous() ? t : t.contiguous();
    if (!buf.is_same(t)) copy_back.emplace_back(t, buf);
    cuda_bytes += static_cast<int64_t>(buf.nbytes());
    cuda.push_back(buf);
  }
  stats_.allreduce_calls += static_cast<int64_t>(tensors.size());
  // Every rank sees the same devices and dtypes, so every rank takes the same branches.
  std::unique_ptr<Work> work;
  if (!cuda.empty()) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
    auto p = m.launch("all-reduce of " + std::to_string(cuda.size()) + " tensors", cuda_bytes, cuda, [&](ncclComm_t c) {
      for (auto& b : cuda) {
        if (b.numel() == 0) continue;
        const ncclResult_t r = ncclAllReduce(b.data_ptr(), b.data_ptr(), static_cast<size_t>(b.numel()),
                                             static_cast<ncclDataType_t>(nccl_data_type(b.scalar_type())), ncclSum,
                                             c, m.stream);
        if (r != ncclSuccess) return r;
      }
      return ncclSuccess;
    });
    work = std::make_unique<NcclWork>(m, std::move(p), cuda, std::move(copy_back));
  }
  if (!cpu.empty()) m.mpi->allreduce_sum_many(cpu);  // overlaps with the NCCL work
  if (work) work->wait();
}

void NcclCommunicator::broadcast(torch::Tensor& t, int root) {
  ++stats_.broadcast_calls;
  if (!t.is_cuda()) {
    impl_->mpi->broadcast(t, root);
    return;
  }
  auto& m = *impl_;
  m.step = step();
  m.check_tensor(t, "broadcast", false);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  auto buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
  if (!buf.is_same(t)) copy_back.emplace_back(t, buf);
  // A broadcast copies bytes: any dtype travels as uint8.
  const auto bytes = static_cast<int64_t>(buf.nbytes());
  auto p = m.launch("broadcast", bytes, {buf}, [&](ncclComm_t c) {
    if (bytes == 0) return ncclSuccess;
    return ncclBroadcast(buf.data_ptr(), buf.data_ptr(), static_cast<size_t>(bytes), ncclUint8, root, c, m.stream);
  });
  NcclWork(m, std::move(p), {buf}, std::move(copy_back)).wait();
}

std::vector<torch::Tensor> NcclCommunicator::allgather(const torch::Tensor& t) {
  if (!t.is_cuda()) return impl_->mpi->allgather(t);
  auto& m = *impl_;
  m.step = step();
  m.check_tensor(t, "all-gather", false);
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  auto in = t.contiguous();
  auto out = torch::empty({m.size, in.numel()}, in.options());
  const auto bytes = static_cast<int64_t>(in.nbytes());
  auto p = m.launch("all-gather", bytes * m.size, {in, out}, [&](ncclComm_t c) {
    if (bytes == 0) return ncclSuccess;
    return ncclAllGather(in.data_ptr(), out.data_ptr(), static_cast<size_t>(bytes), ncclUint8, c, m.stream);
  });
  NcclWork(m, std::move(p), {in, out}, {}).wait();
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < m.size; ++r) parts.push_back(out[r].view(t.sizes()));
  return parts;
}

namespace {

// A sharded collective on the comm stream over t's contiguous buffer (t itself, or a copy
// written back in wait()); `call(comm, base, buf)` issues the NCCL call on it and returns its result.
template <class Call>
std::unique_ptr<Work> in_place_collective(NcclCommunicator::Impl& m, int64_t step, const torch::Tensor& t,
                                          const char* what, bool reduce, Call&& call) {
  m.check_tensor(t, what, reduce);
  m.step = step;
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(m.device));
  auto buf = t.is_contiguous() ? t : t.contiguous();
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copy_back;
  if (!buf.is_same(t)) copy_back.emplace_back(t, buf);
  auto p = m.launch(what, static_cast<int64_t>(buf.nbytes()), {buf},
                    [&](ncclComm_t c) { return call(c, static_cast<char*>(buf.data_ptr()), buf); });
  return std::make_unique<NcclWork>(m, std::move(p), std::vector<torch::Tensor>{buf}, std::move(copy_back));
}

}  // namespace

// ncclReduceScatter in place: the output is this rank's chunk of the input buffer, which NCCL
// allows (recvbuff == sendbuff + rank * recvcount).
std::unique_ptr<Work> NcclCommunicator::reduce_scatter_sum_async(torch::Tensor t) {
  auto& m = *impl_;
  const int64_t chunk = shard_chunk(t, rank(), size()).numel();
  ++stats_.reduce_scatter_calls;
  stats_.reduce_scatter_bytes += static_cast<int64_t>(t.nbytes());
  if (!t.is_cuda()) return m.mpi->reduce_scatter_sum_async(t);
  return in_place_collective(m, step(), t, "reduce-scatter", true,
                             [&](ncclComm_t c, char* base, const torch::Tensor& buf) {
                               if (chunk == 0) return ncclSuccess;
                               return ncclReduceScatter(base, base + m.rank * chunk * buf.element_size(),
                                                        static_cast<size_t>(chunk),
                                                        static_cast<ncclDataType_t>(nccl_data_type(buf.scalar_type())),
                                                        ncclSum, c, m.stream);
                             });
}

// ncclAllGather in place (sendbuff == recvbuff + rank * sendcount); bytes travel as uint8.
std::unique_ptr<Work> NcclCommunicator::allgather_async(torch::Tensor t) {
  auto& m = *impl_;
  const int64_t chunk_bytes = shard_chunk(t, rank(), size()).numel() * t.element_size();
  ++stats_.allgather_calls;
  stats_.allgather_bytes += static_cast<int64_t>(t.nbytes());
  if (!t.is_cuda()) return m.mpi->allgather_async(t);
  return in_place_collective(m, step(), t, "all-gather", false, [&](ncclComm_t c, char* base, const torch::Tensor&) {
    if (chunk_bytes == 0) return ncclSuccess;
    return ncclAllGather(base + m.rank * chunk_bytes, base, static_cast<size_t>(chunk_bytes), ncclUint8, c, m.stream);
  });
}

void NcclCommunicator::barrier() { impl_->mpi->barrier(); }

void NcclCommunicator::abort(int code) {
  auto& m = *impl_;
  if (m.size == 1) return;  // nobody waits on us: the caller exits by itself
  if (m.failing.exchange(true)) park();  // the watchdog is ending the job already
  m.abort_comm();
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

#endif  // LEANTRAIN_HAVE_NCCL

}  // namespace lt::comm
