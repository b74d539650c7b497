#pragma once
// What may happen around a Trainer's steps besides training: test fault injection
// (faults.h) and benchmark turn-taking (turns.h) come in through this interface, so the
// training loop reads as a loop. Torch-free.
#include <cstdint>
#include <memory>

namespace lt::trainers {

/// A storage fault to inject into a checkpoint write (faults.h: ckpt_fail, ckpt_kill).
enum class CheckpointFault { kNone, kFail, kKill };

/// A fault to inject into a micro-batch (faults.h: nan, oom): its loss made NaN (the
/// non-finite policy's test), or an out-of-memory error raised (the back-off's test).
enum class MicroBatchFault { kNone, kNanLoss, kOutOfMemory };

/// Called by Trainer::run() and Trainer::train_step() at fixed points; every default does
/// nothing. `step` is 1-based (the optimizer step being run), `rank` this process's rank.
class TrainerHooks {
 public:
  virtual ~TrainerHooks() = default;
  /// Before the step starts (may block: a turn; may not return: a fault).
  virtual void step_begin(int64_t step, int rank) { (void)step, (void)rank; }
  /// After the step, its metrics, evaluation and checkpoint.
  virtual void step_end(int64_t step) { (void)step; }
  /// After the last step, before the run's teardown.
  virtual void run_end() {}
  /// Test-only: the fault, if any, to inject into a micro-batch of this step, called for every
  /// micro-batch after its forward, its gradient hooks armed, before its backward (the step's
  /// one fault point). `last`: the step's last micro-batch; `attempt`: 0 on the step's first
  /// try, more after an out-of-memory back-off redid it.
  virtual MicroBatchFault micro_batch_fault(int64_t step, int rank, bool last, int attempt) {
    return (void)step, (void)rank, (void)last, (void)attempt, MicroBatchFault::kNone;
  }
  /// The storage fault, if any, to inject into the checkpoint written after this step.
  virtual CheckpointFault checkpoint_fault(int64_t step, int rank) {
    return (void)step, (void)rank, CheckpointFault::kNone;
  }
};

/// The hooks the command line installs: LEANTRAIN_FAULT (faults.h) and LEANTRAIN_BENCH_TURNS
/// (turns.h), each inert when unset. Throws ConfigError for a bad value, or for turns under
/// more than one rank.
std::shared_ptr<TrainerHooks> hooks_from_env(int world_size);

}  // namespace lt::trainers
