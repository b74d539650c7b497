#pragma once
// What train_step (trainer.cpp) and its measurements (step_telemetry.cpp) share: the
// micro-batches' leftovers and StepTelemetry. Private to trainers/.
#include <optional>
#include <string>

#include "leantrain/trainers/phase_clock.h"
#include "leantrain/trainers/trainer.h"
#include "trainer_internal.h"

namespace lt::trainers {

// What the micro-batches of one try of a step left behind (Note [Out-of-memory back-off]).
// Their data and compute times are spans of the Trainer's PhaseClock.
struct Trainer::MicroBatches {
  torch::Tensor loss_sum;  // on the device: one host sync per step
  int64_t tokens = 0;
  bool last_backward_begun = false, oom = false;
  int64_t done = 0;             // micro-batches whose backward completed
  int64_t backward_begun = -1;  // the last micro-batch begin_backward() was called for
  std::string oom_what;
};

// Note [Step telemetry]: besides its loss and its update, a step measures its times, its
// memory (Note [Memory breakdown]) and its collectives. StepTelemetry gathers them into the
// StepResult at fixed points of the step, so train_step reads as the training it does. Its
// construction starts the step's clock and its memory peak; each try of the step (an
// out-of-memory back-off redoes it) adds its times; done() ends the step's measurements. The
// phases' times are spans between marks of the Trainer's PhaseClock, host clocks or CUDA
// events (Note [Step timings on a GPU], phase_clock.cpp), read once, in done().
class Trainer::StepTelemetry {
 public:
  StepTelemetry(Trainer& t, StepResult& r);

  /// After the step's gradients were zeroed.
  void base_memory();
  /// Before a try's micro-batches.
  void try_begins();
  /// After them: the collectives they issued besides the gradient buckets started in the last
  /// backward (must be none: accumulation is local; sharded, the buckets' reduce-scatters are
  /// counted as such, not as all-reduces).
  void micro_batches_ran(const MicroBatches& mb);
  /// Before the gradient reduction: the mark where the update's time (and the exposed
  /// communication) starts.
  PhaseClock::Mark reduction_begins();
  /// After it: its times and its all-reduces.
  void gradients_reduced(const MicroBatches& mb, PhaseClock::Mark begun);
  /// Adds the time since `since` to the update's (sync wait, flags, unscale, clip, step).
  void add_update_time(PhaseClock::Mark since);
  /// Before the update: the micro-batching as run, the gradients outside the buckets (those in
  /// them are counted as buckets) and the loss scale the step ran with.
  void before_update();
  /// After the update: the phases' times, the step's collectives, its bytes counted as ring
  /// algorithms send them (StepResult::comm_bytes), its time and its peak.
  void done();

 private:
  Trainer& t_;
  StepResult& r_;
  trainer_detail::Clock::time_point start_;
  comm::CommStats at_start_;
  int64_t calls_at_try_ = 0;
  // On a device: the last try's gradient reduction as marks (GradSyncTimes are host clocks).
  std::optional<PhaseClock::Mark> reduce_from_, reduce_to_, first_bucket_;
};

}  // namespace lt::trainers
