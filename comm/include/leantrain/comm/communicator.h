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

#include <torch/torch.h>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"

namespace lt::comm {

/// What a communicator has carried (for the counting tests and the comm metrics).
struct CommStats {
  int64_t allreduce_calls = 0;  // one per tensor all-reduced
  int64_t allreduce_bytes = 0;
  int64_t broadcast_calls = 0;
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
  /// Overwrites `t` on every rank with root's values.
  virtual void broadcast(torch::Tensor& t, int root) = 0;
  /// Returns every rank's `t`, in rank order.
  virtual std::vector<torch::Tensor> allgather(const torch::Tensor& t) = 0;
  virtual void barrier() = 0;

  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
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
  void barrier() override {}
};

/// Picks the backend from comm.backend and the world: auto is local for a world of one and
/// MPI otherwise (NCCL is not built yet: CUDA tensors travel through host staging).
/// Throws ConfigError naming comm.backend when the choice cannot work here.
std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx);

/// Versions of the communication libraries this binary links, for --version.
std::string mpi_library_version();
std::string nccl_version();  // "not built" when the toolkit was absent at build time

}  // namespace lt::comm
