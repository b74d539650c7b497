#pragma once
// The MPI backend (CPU collectives; CUDA tensors through host staging). MPI's headers stay
// in the .cpp: callers see only the Communicator interface.
#include <string>

#include "leantrain/comm/communicator.h"

namespace lt::comm {

class MpiCommunicator final : public Communicator {
 public:
  /// Initialises MPI unless the host program did. A collective that does not complete
  /// within timeout_s is reported (collective, bytes, rank, host) and aborts the job.
  MpiCommunicator(double timeout_s, std::string host);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  void allreduce_sum(torch::Tensor& t) override;
  void allreduce_sum_many(std::vector<torch::Tensor>& tensors) override;
  /// MPI_Iallreduce in place (CUDA or MPI-typeless tensors: through a host fp32 copy, written
  /// back in wait()). test() is MPI_Test, which also drives Open MPI's progress for every
  /// collective in flight; wait() is the deadline loop of the blocking calls.
  std::unique_ptr<Work> allreduce_sum_async(torch::Tensor t) override;
  /// MPI_Ireduce_scatter_block / MPI_Iallgather (in place), with the same staging, progress
  /// and deadline as allreduce_sum_async (Note [Shard chunks]).
  std::unique_ptr<Work> reduce_scatter_sum_async(torch::Tensor t) override;
  std::unique_ptr<Work> allgather_async(torch::Tensor t) override;
  void broadcast(torch::Tensor& t, int root) override;
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override;
  void barrier() override;
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  void abort(int code) override;

 private:
  friend class MpiWork;
  void wait(void* request, const char* what, int64_t bytes);
  torch::Tensor host_buffer(const torch::Tensor& t, bool& staged) const;

  double timeout_s_;
  std::string host_;
  int rank_ = 0, size_ = 1;
  bool owns_mpi_ = false;
};

}  // namespace lt::comm
