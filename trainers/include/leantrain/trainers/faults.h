#pragma once
// Fault injection for tests: LEANTRAIN_FAULT="kind@step[:rank][,kind@step[:rank]...]" makes a
// run misbehave at the start of optimizer step `step` (1-based) on `rank` (all ranks when
// omitted). Kinds:
//   kill     SIGKILL this process (a crashed rank)
//   hang     sleep forever without touching MPI (a stuck rank)
//   throw    throw std::runtime_error (a rank that fails with an error)
//   sigterm  raise SIGTERM (a preemption notice: checkpoint, then exit 75)
//   nan      make this step's loss NaN (non-finite loss policy)
//   ckpt_fail  the checkpoint written at or after this step fails mid-write (a storage fault)
// Unknown kinds are a ConfigError naming the variable.
#include <cstdint>
#include <string>
#include <vector>

namespace lt::trainers {

enum class FaultKind { kKill, kHang, kThrow, kSigterm, kNan, kCheckpointFail };

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

}  // namespace lt::trainers
