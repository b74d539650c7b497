#pragma once
// The small decisions of a training step, each a pure function or a tiny state machine the
// Trainer consults (trainer.h): the out-of-memory back-off, the non-finite loss policy and the
// checkpoint schedule. Torch-free, so they are unit-tested without a model.
#include <cstdint>
#include <string>

namespace lt::trainers {

/// Note [Out-of-memory back-off] (trainer.cpp): the micro-batch to redo a step with after an
/// out-of-memory error at `micro`: half of it, or an odd one's largest proper divisor (1 for a
/// prime), so the per-rank batch stays a whole number of micro-batches. 0 when `micro` is 1:
/// nothing smaller exists.
int64_t backoff_micro_batch(int64_t micro);

/// Note [Non-finite loss]: fp16 leaves a NaN/inf loss to the loss scaler (its gradients are
/// non-finite too: the step is skipped and the scale backs off). In fp32/bf16 the update is
/// never applied: "stop" ends the run on every rank together, "skip" drops the update (the
/// step, its samples and the schedule still advance, as a skipped fp16 step does) up to
/// `max_skips` steps in a row.
class NonfinitePolicy {
 public:
  NonfinitePolicy(std::string mode, int64_t max_skips, bool scaler_handles_it);
  /// Called once per step (1-based `step`) with the loss every rank agreed on. Returns true
  /// when the update must be skipped; throws lt::TrainingStopped (naming `checkpoint_dir`,
  /// whose checkpoints stay intact) when the run must stop.
  bool skip_update(int64_t step, double loss, const std::string& checkpoint_dir);

 private:
  std::string mode_;
  int64_t max_skips_;
  bool scaler_handles_it_;
  int64_t in_a_row_ = 0;
};

/// Sync-step checkpoints: every `every_steps` optimizer steps (0: none on the way), after the
/// last step unless `at_end` is false, and always when the run stops early (preemption).
struct CheckpointSchedule {
  int64_t every_steps = 0;
  bool at_end = true;
  /// `step` is 1-based: the number of optimizer steps done.
  bool due(int64_t step, int64_t total_steps, bool stopping) const {
    return stopping || (step == total_steps && at_end) || (every_steps > 0 && step % every_steps == 0);
  }
};

}  // namespace lt::trainers
