#include "mpi_deadline.h"

#include <mpi.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"

namespace lt::comm {
namespace {

// Note [Who is stuck]
// A survivor of a stuck collective knows only that it waited too long; MPI gives it no
// error (MACHINE-NOTES: survivors never hear from MPI). Before aborting, every rank whose
// deadline passed sends its step to every other rank on a reserved tag and listens for
// kProbeSeconds: the ranks that are also waiting in the collective hit their deadline at
// about the same time and answer; a rank that is stuck elsewhere (or dead) does not. The
// report names the ranks that did not answer. Best effort: a rank that entered the
// collective more than kProbeSeconds later than this one is named too. Point-to-point on a
// reserved tag does not interfere with the collectives in flight.
constexpr int kProbeTag = 0x1ea7;
constexpr double kProbeSeconds = 2.0;

std::vector<int> silent_ranks(int rank, int size, int64_t step) {
  std::vector<int64_t> out(1, step), in(static_cast<size_t>(size), -1);
  std::vector<MPI_Request> sends, recvs(static_cast<size_t>(size), MPI_REQUEST_NULL);
  for (int p = 0; p < size; ++p) {
    if (p == rank) continue;
    sends.emplace_back();
    MPI_Isend(out.data(), 1, MPI_INT64_T, p, kProbeTag, MPI_COMM_WORLD, &sends.back());
    MPI_Irecv(&in[static_cast<size_t>(p)], 1, MPI_INT64_T, p, kProbeTag, MPI_COMM_WORLD, &recvs[static_cast<size_t>(p)]);
  }
  std::vector<char> answered(static_cast<size_t>(size), 0);
  answered[static_cast<size_t>(rank)] = 1;
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < kProbeSeconds) {
    bool all = true;
    for (int p = 0; p < size; ++p) {
      if (answered[static_cast<size_t>(p)]) continue;
      int flag = 0;
      MPI_Test(&recvs[static_cast<size_t>(p)], &flag, MPI_STATUS_IGNORE);
      answered[static_cast<size_t>(p)] = static_cast<char>(flag);
      all = all && flag;
    }
    if (all) break;
    sched_yield();
  }
  std::vector<int> silent;
  for (int p = 0; p < size; ++p)
    if (!answered[static_cast<size_t>(p)]) silent.push_back(p);
  return silent;  // the requests are abandoned: MPI_Abort follows
}

}  // namespace

void abort_on_missed_deadline(const MissedDeadline& m, void (*before_abort)(void*), void* ctx) {
  std::string msg = "collective " + m.collective + " (" + std::to_string(m.bytes) + " bytes) at step " +
                    std::to_string(m.step) + " on rank " + std::to_string(m.rank) + " host " + m.host +
                    " did not complete within " + std::to_string(m.timeout_s) +
                    " s (comm.timeout_s, or comm.startup_timeout_s for setup and the step after an "
                    "evaluation or a checkpoint)";
  if (m.size > 1) {
    const auto silent = silent_ranks(m.rank, m.size, m.step);
    if (silent.empty()) {
      msg += ": every other rank is waiting too (mismatched collectives, or a network far slower than the deadline)";
    } else {
      msg += ": rank";
      if (silent.size() > 1) msg += "s";
      for (size_t i = 0; i < silent.size(); ++i) msg += (i ? ", " : " ") + std::to_string(silent[i]);
      msg += " did not answer within " + std::to_string(static_cast<int>(kProbeSeconds)) + " s (stuck or dead)";
    }
  }
  lt::log::error(msg + "; aborting the job");
  std::fflush(stderr);
  if (before_abort != nullptr) before_abort(ctx);
  MPI_Abort(MPI_COMM_WORLD, kExitCollectiveTimeout);
  std::_Exit(kExitCollectiveTimeout);  // MPI_Abort does not return; should it, do not either
}

}  // namespace lt::comm
