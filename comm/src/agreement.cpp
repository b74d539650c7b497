#include "leantrain/comm/agreement.h"

#include <string>
#include <vector>

#include "leantrain/runtime/errors.h"

namespace lt::comm {

// Note [Setup agreement]: the ranks of a job build their components each on its own (model,
// data sets, a checkpoint to resume from), and an input can be wrong on one host only: a data
// file missing from one node's disk. That rank's error is a data error, exit 2; but its peers,
// which know nothing of it, would go on into their first collective and wait there until the
// startup deadline (comm.startup_timeout_s, 30 minutes by default), while the failed rank
// waits for them in MPI_Finalize. So every rank checks in after setup with its exit code: one
// allgather of an int64, which every rank reaches whether its setup succeeded or threw. Then
// every rank knows, and exits with the lowest failing rank's code, each with one line: the
// failed rank its error, the others which rank failed. Nothing is aborted, so mpirun prints no
// MPI_Abort banner and exits with that code. Errors after the agreement follow Note [Errors on
// one rank] (runtime/src/errors.cpp).
void agree_on_setup(Communicator& comm, const std::exception_ptr& mine, torch::Device device) {
  if (comm.size() == 1) {
    if (mine) std::rethrow_exception(mine);
    return;
  }
  const int64_t code = mine ? classify_error(mine).exit_code : kExitOk;
  auto t = torch::full({1}, mine && code == kExitOk ? int64_t{kExitFailure} : code,
                       torch::TensorOptions().dtype(torch::kLong).device(device));
  const std::vector<torch::Tensor> all = comm.allgather(t);
  if (mine) std::rethrow_exception(mine);
  for (size_t r = 0; r < all.size(); ++r) {
    const int64_t c = all[r].to(torch::kCPU).item<int64_t>();
    if (c != kExitOk)
      throw PeerFailed("rank " + std::to_string(r) + " failed while setting up (exit " + std::to_string(c) +
                           "; its message says why); this rank stops with it",
                       static_cast<int>(c));
  }
}

}  // namespace lt::comm
