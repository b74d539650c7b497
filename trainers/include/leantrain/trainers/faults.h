#pragma once
// Fault injection for tests: LEANTRAIN_FAULT="kind@step[:rank][,kind@step[:rank]...]" makes a
// run misbehave at the start of optimizer step `step` (1-based) on `rank` (all ranks when
// omitted). Kinds:
//   kill     SIGKILL this process (a crashed rank)
//   hang     sleep forever without touching MPI (a stuck rank)
//   throw    throw std::runtime_error (a rank that fails with an error)
//   sigterm  raise SIGTERM (a preemption notice: checkpoint, then exit 75)
//   nan      make this step's loss NaN (non-finite loss policy)
//   oom      an out-of-memory error (c10::OutOfMemoryError) in the first try of this step's
//            last micro-batch, after its gradient hooks are armed (the back-off)
//   ckpt_fail   the checkpoint written after this step fails mid-write, as on a full disk
//               (a storage fault: RLIMIT_FSIZE below its size, writes fail with EFBIG)
//   ckpt_kill   the process is SIGKILLed in the middle of writing the checkpoint of this
//               step (a crash mid-write: the same limit, and death at the refused write)
// Unknown kinds are a ConfigError naming the variable.
#include <cstdint>
#include <string>
#include <vector>

namespace lt::trainers {

enum class FaultKind { kKill, kHang, kThrow, kSigterm, kNan, kOom, kCheckpointFail, kCheckpointKill };

struct Fault {
  FaultKind kind;
  int64_t step;
  int rank;  // -1: every rank
};

class FaultInjector {
 public:
  /// Parses LEANTRAIN_FAULT (empty: no faults).
  static FaultInjector from_env();
  static FaultInjector parse(const std::string& spec);

  /// True when `kind` is planned for `step` (1-based) on `rank`.
  bool fires(FaultKind kind, int64_t step, int rank) const;
  /// kill / hang / throw / sigterm planned for the start of `step`.
  void at_step_start(int64_t step, int rank) const;
  bool empty() const { return faults_.empty(); }

 private:
  std::vector<Fault> faults_;
};

/// While alive, no file of this process may grow past `bytes` (RLIMIT_FSIZE). With `kill`
/// the process is SIGKILLed at the first write that would (a crash in the middle of a
/// write); without, that write fails with EFBIG, as on a full disk. Restores the limit and
/// the SIGXFSZ disposition when destroyed.
class FileSizeFault {
 public:
  FileSizeFault(int64_t bytes, bool kill);
  ~FileSizeFault();
  FileSizeFault(const FileSizeFault&) = delete;
  FileSizeFault& operator=(const FileSizeFault&) = delete;

 private:
  uint64_t old_cur_ = 0, old_max_ = 0;  // rlim_t
  void (*old_handler_)(int) = nullptr;
};

}  // namespace lt::trainers
