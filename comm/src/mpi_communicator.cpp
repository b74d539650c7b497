// The MPI backend: CPU tensors directly, CUDA tensors through host staging (Open MPI from
// Debian is not CUDA-aware). Every collective is non-blocking plus a test loop with a
// deadline: Open MPI gives survivors no error when a peer is stuck, so an application
// deadline followed by MPI_Abort is the only way a stuck job ends (MACHINE-NOTES.md).
#include "leantrain/comm/mpi_communicator.h"

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "mpi_deadline.h"

namespace lt::comm {
namespace {

MPI_Datatype mpi_type(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat: return MPI_FLOAT;
    case torch::kDouble: return MPI_DOUBLE;
    case torch::kInt: return MPI_INT;
    case torch::kLong: return MPI_INT64_T;
    case torch::kByte: return MPI_UINT8_T;
    default: return MPI_DATATYPE_NULL;
  }
}

// MPI is finalised when the last MpiCommunicator of the process goes, if one of them initialised
// it: make_communicator's bootstrap communicator (the backend agreement) can then end before the
// NCCL backend's own, which it started MPI for. Constructed and destroyed on the main thread.
int g_live_communicators = 0;

}  // namespace

MpiCommunicator::MpiCommunicator(double timeout_s, std::string host) : timeout_s_(timeout_s), host_(std::move(host)) {
  int inited = 0;
  MPI_Initialized(&inited);
  if (!inited) {
    // Note [Non-blocking all-reduce algorithm]: Open MPI's libnbc picks a binomial tree
    // (reduce to one rank, then broadcast) for MPI_Iallreduce below 4 ranks, which ran at
    // ~0.6x the busbw of the blocking MPI_Allreduce on 2 ranks here; its ring (reduce-scatter
    // + all-gather) reaches ~0.9x (docs/BENCH_COMM.md). MCA parameters are read at
    // MPI_Init from OMPI_MCA_* variables: set the ring unless the user chose (overwrite = 0).
    // Other MPI libraries ignore the variable.
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", /*overwrite=*/0);
    int provided = 0;
    // SERIALIZED, not FUNNELED: GradientSync starts and tests all-reduces from autograd hooks,
    // which for CUDA parameters run on the autograd engine's device thread while the main
    // thread blocks in backward() — one thread at a time, but not always the main one.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
  }
  static const bool initialised_here = !inited;  // the first communicator's answer, for the process
  owns_mpi_ = initialised_here;
  ++g_live_communicators;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (--g_live_communicators == 0 && owns_mpi_ && !finalized) MPI_Finalize();
}

void MpiCommunicator::wait(void* request, const char* what, int64_t bytes) {
  auto* req = static_cast<MPI_Request*>(request);
  const auto t0 = std::chrono::steady_clock::now();
  int done = 0;
  while (true) {
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (waited > timeout_s_) {
      // A peer is gone or stuck; no error will ever arrive. Say who and what, then end the job.
      abort_on_missed_deadline({what, bytes, step_, rank_, size_, host_, timeout_s_});
    }
    sched_yield();
  }
}

torch::Tensor MpiCommunicator::host_buffer(const torch::Tensor& t, bool& staged) const {
  staged = !t.is_cpu() || mpi_type(t.scalar_type()) == MPI_DATATYPE_NULL || !t.is_contiguous();
  if (!staged) return t;
  // bf16/fp16 have no MPI type: reduce in fp32 (exact for sums of a few terms, and what
  // gradient buckets carry anyway).
  auto type = mpi_type(t.scalar_type()) == MPI_DATATYPE_NULL ? torch::kFloat : t.scalar_type();
  return t.to(torch::TensorOptions().device(torch::kCPU).dtype(type)).contiguous();
}

void MpiCommunicator::allreduce_sum(torch::Tensor& t) {
  std::vector<torch::Tensor> one{t};
  allreduce_sum_many(one);
}

void MpiCommunicator::allreduce_sum_many(std::vector<torch::Tensor>& tensors) {
  std::vector<torch::Tensor> bufs;
  std::vector<char> staged(tensors.size());
  std::vector<MPI_Request> reqs(tensors.size());
  int64_t bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    bool s = false;
    bufs.push_back(host_buffer(tensors[i], s));
    staged[i] = s;
    bytes += static_cast<int64_t>(bufs[i].nbytes());
    MPI_Iallreduce(MPI_IN_PLACE, bufs[i].data_ptr(), static_cast<int>(bufs[i].numel()),
                   mpi_type(bufs[i].scalar_type()), MPI_SUM, MPI_COMM_WORLD, &reqs[i]);
  }
  for (size_t i = 0; i < reqs.size(); ++i) wait(&reqs[i], "all-reduce", static_cast<int64_t>(bufs[i].nbytes()));
  for (size_t i = 0; i < tensors.size(); ++i)
    if (staged[i]) tensors[i].copy_(bufs[i]);
  stats_.allreduce_calls += static_cast<int64_t>(tensors.size());
  stats_.allreduce_bytes += bytes;
}

// A non-blocking MPI collective in flight. The host buffers (the tensor itself, or its staging
// copy, and any receive buffer) are held here so they outlive the request; `on_done` writes a
// staged result back on completion.
class MpiWork final : public Work {
 public:
  MpiWork(MpiCommunicator& comm, const char* what, int64_t bytes, std::vector<torch::Tensor> keep,
          std::function<void()> on_done)
      : comm_(comm), what_(what), bytes_(bytes), keep_(std::move(keep)), on_done_(std::move(on_done)) {}
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;
  // MPI still writes into the buffers until the request completes: never free them under MPI's feet.
  ~MpiWork() override {
    if (!done_) wait();
  }

  MPI_Request* request() { return &req_; }

  bool test() override {
    if (done_) return true;
    int flag = 0;
    MPI_Test(&req_, &flag, MPI_STATUS_IGNORE);
    if (flag) complete();
    return done_;
  }
  void wait() override {
    if (done_) return;
    comm_.wait(&req_, what_, bytes_);
    complete();
  }

 private:
  void complete() {
    if (on_done_) on_done_();
    // Release the buffers now, also those the completion captured: a Work may live on after
    // its collective (GradientSync keeps it to the end of the step), and a transient bucket
    // must be freed when its reduce-scatter is done, not then.
    on_done_ = nullptr;
    keep_.clear();
    done_ = true;
  }

  MpiCommunicator& comm_;
  const char* what_;
  int64_t bytes_;
  std::vector<torch::Tensor> keep_;
  std::function<void()> on_done_;
  bool done_ = false;
  MPI_Request req_ = MPI_REQUEST_NULL;
};

namespace {
// A non-blocking collective's completion on `buf`, t's host buffer: a staged result back into t.
std::function<void()> copy_back(torch::Tensor t, torch::Tensor buf, bool staged) {
  return [t, buf, staged]() mutable {
    if (staged) t.copy_(buf);
  };
}
}  // namespace

std::unique_ptr<Work> MpiCommunicator::allreduce_sum_async(torch::Tensor t) {
  bool staged = false;
  auto buf = host_buffer(t, staged);
  auto work = std::make_unique<MpiWork>(*this, "all-reduce", static_cast<int64_t>(buf.nbytes()),
                                        std::vector<torch::Tensor>{buf}, copy_back(t, buf, staged));
  MPI_Iallreduce(MPI_IN_PLACE, buf.data_ptr(), static_cast<int>(buf.numel()), mpi_type(buf.scalar_type()), MPI_SUM,
                 MPI_COMM_WORLD, work->request());
  ++stats_.allreduce_calls;
  stats_.allreduce_bytes += static_cast<int64_t>(buf.nbytes());
  return work;
}

// MPI_Ireduce_scatter_block in place: MPI leaves this rank's sums at the start of the buffer
// (over chunk 0, whose values the contract leaves unspecified on the other ranks), and on
// completion they are moved to this rank's chunk. No receive buffer: a chunk per bucket in
// flight would be transient memory the planner does not count.
std::unique_ptr<Work> MpiCommunicator::reduce_scatter_sum_async(torch::Tensor t) {
  auto mine = shard_chunk(t, rank_, size_);
  bool staged = false;
  auto buf = host_buffer(t, staged);
  const int64_t c = mine.numel();
  const int r = rank_;
  auto work = std::make_unique<MpiWork>(*this, "reduce-scatter", static_cast<int64_t>(buf.nbytes()),
                                        std::vector<torch::Tensor>{buf}, [mine, buf, c, r, staged]() mutable {
                                          // Chunks 0 and r do not overlap for r > 0; for r = 0
                                          // unstaged, the sums are where they belong already.
                                          if (staged || r > 0) mine.copy_(buf.reshape({-1}).narrow(0, 0, c));
                                        });
  MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf.data_ptr(), static_cast<int>(c), mpi_type(buf.scalar_type()), MPI_SUM,
                            MPI_COMM_WORLD, work->request());
  ++stats_.reduce_scatter_calls;
  stats_.reduce_scatter_bytes += static_cast<int64_t>(buf.nbytes());
  return work;
}

// MPI_Iallgather in place: each rank's contribution is already at its chunk of the buffer.
std::unique_ptr<Work> MpiCommunicator::allgather_async(torch::Tensor t) {
  const auto chunk = shard_chunk(t, rank_, size_).numel();
  bool staged = false;
  auto buf = host_buffer(t, staged);
  auto work = std::make_unique<MpiWork>(*this, "all-gather", static_cast<int64_t>(buf.nbytes()),
                                        std::vector<torch::Tensor>{buf}, copy_back(t, buf, staged));
  MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data_ptr(), static_cast<int>(chunk),
                 mpi_type(buf.scalar_type()), MPI_COMM_WORLD, work->request());
  ++stats_.allgather_calls;
  stats_.allgather_bytes += static_cast<int64_t>(buf.nbytes());
  return work;
}

void MpiCommunicator::abort(int code) {
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

void MpiCommunicator::broadcast(torch::Tensor& t, int root) {
  bool staged = false;
  auto buf = host_buffer(t, staged);
  MPI_Request req;
  MPI_Ibcast(buf.data_ptr(), static_cast<int>(buf.numel()), mpi_type(buf.scalar_type()), root, MPI_COMM_WORLD, &req);
  wait(&req, "broadcast", static_cast<int64_t>(buf.nbytes()));
  if (staged) t.copy_(buf);
  ++stats_.broadcast_calls;
}

std::vector<torch::Tensor> MpiCommunicator::allgather(const torch::Tensor& t) {
  bool staged = false;
  auto buf = host_buffer(t, staged);
  auto out = torch::empty({size_, buf.numel()}, buf.options());
  MPI_Request req;
  MPI_Iallgather(buf.data_ptr(), static_cast<int>(buf.numel()), mpi_type(buf.scalar_type()), out.data_ptr(),
                 static_cast<int>(buf.numel()), mpi_type(buf.scalar_type()), MPI_COMM_WORLD, &req);
  wait(&req, "all-gather", static_cast<int64_t>(out.nbytes()));
  std::vector<torch::Tensor> parts;
  for (int r = 0; r < size_; ++r) parts.push_back(out[r].view(t.sizes()).to(t.options()));
  return parts;
}

void MpiCommunicator::barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  wait(&req, "barrier", 0);
}

}  // namespace lt::comm
