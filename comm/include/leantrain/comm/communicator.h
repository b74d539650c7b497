#pragma once
// One interface for collectives, whatever carries them (Horovod's op layer, c10d's
// ProcessGroup): MPI for CPU tensors, NCCL for CUDA tensors, and a single-process backend
// that reports rank 0 / size 1 so callers never branch on the world size (llm.c's fallback).
//
// Contract: every rank calls the same collectives in the same order with tensors of the
// same shape and dtype; tensors are contiguous; results are in place.
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"

namespace lt::comm {

/// What a communicator has carried (for the counting tests and the comm metrics).
struct CommStats {
  int64_t allreduce_calls = 0;  // one per tensor all-reduced
  int64_t allreduce_bytes = 0;
  int64_t broadcast_calls = 0;
  int64_t reduce_scatter_calls = 0;  // one per tensor reduce-scattered
  int64_t reduce_scatter_bytes = 0;  // the whole tensor's bytes (what an all-reduce of it would count)
  int64_t allgather_calls = 0;       // in-place all-gathers (allgather_async)
  int64_t allgather_bytes = 0;       // the whole tensor's bytes
};

/// A collective in flight (c10d's Work). A collective that misses the communicator's
/// deadline is reported (collective, rank, host) and tears the job down: wait() then never
/// returns. The tensors handed to the collective must stay alive and untouched until wait().
class Work {
 public:
  virtual ~Work() = default;
  /// Drives progress without blocking; true once the collective has completed.
  virtual bool test() = 0;
  /// Blocks until the collective has completed (for CUDA tensors: until the caller's current
  /// stream is ordered after it, with no host sync).
  virtual void wait() = 0;
  /// wait(), then blocks the host until the collective has completed on the device too (NCCL:
  /// its completion event), so that memory it used is free for the next allocation at once:
  /// the back-pressure that bounds buckets in flight (Note [Buckets in flight on a GPU]). For
  /// host collectives (MPI) wait() already is that.
  virtual void wait_host() { wait(); }
};

/// A collective that already completed (the blocking fallback of the async calls).
class CompletedWork final : public Work {
 public:
  bool test() override { return true; }
  void wait() override {}
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  /// Sums `t` over ranks, in place.
  virtual void allreduce_sum(torch::Tensor& t) = 0;
  /// Sums several tensors; backends start all of them before waiting for any.
  virtual void allreduce_sum_many(std::vector<torch::Tensor>& tensors) {
    for (auto& t : tensors) allreduce_sum(t);
  }
  /// Starts summing `t` (contiguous) over ranks in place and returns at once; the result is
  /// there after the returned Work's wait(). Counts as one all-reduce call in stats().
  /// The default runs the blocking all-reduce now.
  virtual std::unique_ptr<Work> allreduce_sum_async(torch::Tensor t) {
    allreduce_sum(t);
    return std::make_unique<CompletedWork>();
  }
  /// Note [Shard chunks]: the sharded collectives split a tensor of n elements (n a multiple
  /// of size()) into size() equal chunks; rank r owns chunk r, elements [r n/size, (r+1) n/size).
  /// A reduce-scatter followed by an all-gather moves the bytes of one all-reduce (the ring
  /// all-reduce is exactly these two phases).
  ///
  /// Starts summing `t` (contiguous) over ranks into this rank's chunk and returns at once:
  /// after wait(), chunk rank() of `t` holds the sum of that chunk over ranks; the other chunks
  /// hold unspecified values. The default is the blocking all-reduce (every chunk summed).
  virtual std::unique_ptr<Work> reduce_scatter_sum_async(torch::Tensor t);
  /// Starts an all-gather in place: on entry chunk rank() of `t` (contiguous) holds this
  /// rank's values; after wait() every chunk holds its owner's values, on every rank. The
  /// default gathers through allgather().
  virtual std::unique_ptr<Work> allgather_async(torch::Tensor t);
  /// The deadline of every collective started from now on, in seconds (comm.timeout_s at
  /// first; the trainer may tighten it once the first step has completed).
  virtual void set_timeout(double seconds) { (void)seconds; }
  /// Overwrites `t` on every rank with root's values.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  /// Returns every rank's `t`, in rank order.
  virtual std::vector<torch::Tensor> allgather(const torch::Tensor& t) = 0;
  virtual void barrier() = 0;

  /// Ends every rank of the job now with exit code `code` (MPI_Abort; ncclCommAbort first on
  /// GPUs), for a failure on this rank that the others cannot know of and would otherwise
  /// wait on until their deadline. A world of one returns (the caller exits by itself).
  virtual void abort(int code) { (void)code; }

  /// The optimizer step the caller is in (1-based; 0 = setup), named in deadline reports.
  void set_step(int64_t step) { step_ = step; }
  int64_t step() const { return step_; }

  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
  int64_t step_ = 0;
};

/// The single-process backend: a world of one, every collective an identity.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "local"; }
  void allreduce_sum(torch::Tensor& t) override {
    ++stats_.allreduce_calls;
    stats_.allreduce_bytes += static_cast<int64_t>(t.nbytes());
  }
  void broadcast(torch::Tensor&, int) override { ++stats_.broadcast_calls; }
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override { return {t.clone()}; }
  std::unique_ptr<Work> reduce_scatter_sum_async(torch::Tensor t) override {
    ++stats_.reduce_scatter_calls;
    stats_.reduce_scatter_bytes += static_cast<int64_t>(t.nbytes());
    return std::make_unique<CompletedWork>();
  }
  std::unique_ptr<Work> allgather_async(torch::Tensor t) override {
    ++stats_.allgather_calls;
    stats_.allgather_bytes += static_cast<int64_t>(t.nbytes());
    return std::make_unique<CompletedWork>();
  }
  void barrier() override {}
};

/// Chunk `rank` of `t` split in `world` equal parts (Note [Shard chunks]); throws
/// std::invalid_argument when t.numel() is not a multiple of world.
torch::Tensor shard_chunk(const torch::Tensor& t, int rank, int world);

/// The backend comm.backend resolves to ("local", "nccl" or "mpi"), a pure function: auto
/// is local for a world of one, NCCL when the run is on CUDA and NCCL is built, MPI
/// otherwise; mpi always works (CUDA tensors then travel through host memory); nccl needs a
/// CUDA device and NCCL built; local needs a world of one. Throws ConfigError naming
/// comm.backend and the fix otherwise.
std::string choose_backend(const std::string& backend, int world, bool on_cuda, bool nccl_available);

/// One rank's side of the backend agreement (Note [Backend agreement] in communicator.cpp).
struct BackendChoice {
  int rank = 0;
  std::string host;
  int device_index = -1;  // its CUDA device (RuntimeContext::device_index); -1: the CPU
  std::string backend;    // what choose_backend gave on that rank; "" when it refused
  std::string error;      // its refusal (a ConfigError's message), when it refused
};

/// The backend every rank runs, a pure function of every rank's choice (per_rank[r]: rank
/// r's) and comm.backend as configured: the choice they share. Throws ConfigError, the same
/// text whatever the caller's rank, naming the ranks, their hosts and devices, when a rank
/// refused (its message) and when the ranks chose differently (auto on a rank without a GPU
/// next to ranks with one).
std::string agree_backend(const std::vector<BackendChoice>& per_rank, const std::string& requested);

/// Every rank's BackendChoice, in rank order, over `comm` (two all-gathers of CPU tensors;
/// every rank of comm calls it). `mine` is the caller's.
std::vector<BackendChoice> exchange_backend_choices(Communicator& comm, const BackendChoice& mine);

/// Makes the backend choose_backend picks for this run (ctx's world and device). In a world
/// of several, the ranks first agree on it over MPI (exchange_backend_choices, agree_backend),
/// so a rank that would choose differently is a ConfigError on every rank, not a hang.
/// Collectives run under comm.startup_timeout_s until the trainer sets the per-step deadline.
/// Throws ConfigError naming comm.backend when the choice cannot work here.
std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx);

/// Versions of the communication libraries this binary links, for --version.
std::string mpi_library_version();
std::string nccl_version();  // "not built" when the toolkit was absent at build time

}  // namespace lt::comm
