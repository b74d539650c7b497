#pragma once
// The end of a collective that missed its deadline, for the MPI-based backends (private to
// comm/: MPI's headers stay in the .cpp).
#include <cstdint>
#include <string>

namespace lt::comm {

struct MissedDeadline {
  std::string collective;  // "all-reduce", "broadcast", ...
  int64_t bytes = 0;
  int64_t step = 0;        // the caller's optimizer step (0: setup)
  int rank = 0, size = 1;
  std::string host;
  double timeout_s = 0;
};

/// Reports `m` (collective, bytes, step, rank, host, deadline), names the ranks that did not
/// answer a short liveness probe (Note [Who is stuck]), then ends the job with
/// MPI_Abort(MPI_COMM_WORLD, 3). `before_abort` runs just before MPI_Abort (NCCL aborts its
/// communicator there). Never returns.
[[noreturn]] void abort_on_missed_deadline(const MissedDeadline& m, void (*before_abort)(void*) = nullptr,
                                           void* ctx = nullptr);

}  // namespace lt::comm
