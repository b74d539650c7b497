#pragma once
// The NCCL backend, hybrid like Horovod's: CUDA tensors go over NCCL on a stream of its own,
// CPU tensors (the trainer's small flags and resume decisions) over the MPI backend, which
// also carries the bootstrap (NCCL's unique id) and the barrier. NCCL's and CUDA's headers
// stay in the .cpp: callers see only the Communicator interface.
//
// Stream contract (Note [Stream handoff] in nccl_communicator.cpp): a collective on a CUDA
// tensor starts after the work already queued on the caller's current CUDA stream, and work
// queued on that stream after wait() (or after a blocking call returns) sees its result. No
// call blocks the host on the GPU in the normal path.
#include <memory>
#include <string>

#include "leantrain/comm/communicator.h"

namespace lt::comm {

/// True when this binary was built with NCCL (the CUDA toolkit was found at build time).
bool nccl_built();

/// The ncclDataType_t (as its integer value) that carries a sum of `t`; -1 when NCCL has
/// none (bool, complex, float8). Exposed for the unit tests of the mapping.
int nccl_data_type(torch::ScalarType t);

class NcclCommunicator final : public Communicator {
 public:
  /// Initialises MPI unless the host program did, makes the NCCL communicator over every
  /// MPI rank on CUDA device `device_index` (the local rank's GPU), and starts the watchdog.
  /// A collective that does not complete within timeout_s, or an asynchronous NCCL error,
  /// is reported (collective, bytes, rank, host) and ends the job: ncclCommAbort, then
  /// MPI_Abort with exit code 3. Throws when NCCL is not built or the device is unusable.
  NcclCommunicator(double timeout_s, std::string host, int device_index);
  ~NcclCommunicator() override;

  int rank() const override;
  int size() const override;
  std::string backend() const override { return "nccl"; }
  void allreduce_sum(torch::Tensor& t) override;
  void allreduce_sum_many(std::vector<torch::Tensor>& tensors) override;
  std::unique_ptr<Work> allreduce_sum_async(torch::Tensor t) override;
  /// ncclReduceScatter / ncclAllGather in place on the comm stream (CPU tensors over MPI).
  std::unique_ptr<Work> reduce_scatter_sum_async(torch::Tensor t) override;
  std::unique_ptr<Work> allgather_async(torch::Tensor t) override;
  void set_timeout(double seconds) override;
  void broadcast(torch::Tensor& t, int root) override;
  std::vector<torch::Tensor> allgather(const torch::Tensor& t) override;
  /// A host barrier over MPI (orders ranks, not GPU work).
  void barrier() override;
  void abort(int code) override;

  struct Impl;  // NCCL/CUDA state, defined in the .cpp

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace lt::comm
