// StepTelemetry: a step's times, memory and collectives (Note [Step telemetry], step_telemetry.h).
#include "step_telemetry.h"

#include <algorithm>

#include "leantrain/optim/optimizer.h"

namespace lt::trainers {

using trainer_detail::Clock;
using trainer_detail::seconds_since;

Trainer::StepTelemetry::StepTelemetry(Trainer& t, StepResult& r) : t_(t), r_(r), start_(Clock::now()) {
  t_.meter_.reset_peak();
  t_.clock_->begin_step();
  r_.timing = t_.clock_->source();
}

// Note [Memory breakdown]: what is allocated at the start of a step is parameters + optimizer
// state + gradient buckets (holding the zeroed gradients under mpirun) + the rest ("other":
// model buffers, the batch, and the background checkpoint writer's snapshot while it writes);
// the step's peak above that is the gradients outside the buckets plus the activations of one
// micro-batch. Optimizer state is summed over its tensors, so a checkpoint snapshot is not
// counted as such.
void Trainer::StepTelemetry::base_memory() {
  at_start_ = t_.comm_.stats();
  r_.base_bytes = t_.meter_.stats().current_bytes;
  r_.optimizer_bytes = optim::optimizer_state_allocated_bytes(*t_.optimizer_);
  r_.other_bytes =
      std::max<int64_t>(0, r_.base_bytes - t_.param_bytes_ - r_.optimizer_bytes - t_.grad_sync_->buffer_bytes());
}

void Trainer::StepTelemetry::try_begins() {
  calls_at_try_ = t_.comm_.stats().allreduce_calls;
  t_.first_bucket_mark_.reset();  // the hook marks this try's first bucket
}

void Trainer::StepTelemetry::micro_batches_ran(const MicroBatches& mb) {
  r_.calls_in_microbatches = t_.comm_.stats().allreduce_calls - calls_at_try_ -
                             (mb.last_backward_begun && t_.shard_ == comm::ShardStage::kNone
                                  ? t_.grad_sync_->last_times().started_in_backward
                                  : 0);
}

PhaseClock::Mark Trainer::StepTelemetry::reduction_begins() { return t_.clock_->mark(); }

void Trainer::StepTelemetry::gradients_reduced(const MicroBatches& mb, PhaseClock::Mark begun) {
  if (t_.world_ > 1) {
    const auto& times = t_.grad_sync_->last_times();
    r_.comm_time_s = times.comm_s;
    r_.comm_exposed_s = times.exposed_s;
    r_.buckets_in_backward = mb.last_backward_begun ? times.started_in_backward : 0;
    if (t_.clock_->on_device()) {  // replaced in done() by the device's spans
      reduce_from_ = begun;
      reduce_to_ = t_.clock_->mark();
      first_bucket_ = t_.first_bucket_mark_;  // unset: no bucket started (none to reduce)
    }
  }
  r_.grad_allreduce_calls = t_.comm_.stats().allreduce_calls - calls_at_try_ - r_.calls_in_microbatches;
}

void Trainer::StepTelemetry::add_update_time(PhaseClock::Mark since) {
  t_.clock_->add(PhaseClock::kUpdate, since, t_.clock_->mark());
}

void Trainer::StepTelemetry::before_update() {
  r_.micro_batch = t_.micro_;
  r_.accumulation = t_.accum_;
  for (const auto& p : t_.params_)
    if (p.grad().defined() && !t_.grad_sync_->in_buckets(p.grad()))
      r_.grad_bytes += static_cast<int64_t>(p.grad().nbytes());
  r_.loss_scale = t_.scaler_->scale_value();
}

void Trainer::StepTelemetry::done() {
  // The phases, read once: on a GPU this waits for the update's last event (Note [Step timings
  // on a GPU]); every earlier mark completed at the step's synchronisation.
  const auto phases = t_.clock_->read();
  r_.data_time_s = phases[PhaseClock::kData];
  r_.compute_s = phases[PhaseClock::kCompute];
  r_.update_s = phases[PhaseClock::kUpdate];
  if (reduce_from_ && reduce_to_) {
    r_.comm_exposed_s = t_.clock_->seconds(*reduce_from_, *reduce_to_);
    r_.comm_time_s = first_bucket_ ? t_.clock_->seconds(*first_bucket_, *reduce_to_) : 0.0;
  }
  const comm::CommStats& now = t_.comm_.stats();
  r_.grad_reduce_scatter_calls = now.reduce_scatter_calls - at_start_.reduce_scatter_calls;
  r_.param_allgather_calls = now.allgather_calls - at_start_.allgather_calls;
  const double ring = t_.world_ > 1 ? static_cast<double>(t_.world_ - 1) / t_.world_ : 0.0;
  r_.comm_bytes = static_cast<int64_t>(
      ring * (2.0 * static_cast<double>(now.allreduce_bytes - at_start_.allreduce_bytes) +
              static_cast<double>(now.reduce_scatter_bytes - at_start_.reduce_scatter_bytes) +
              static_cast<double>(now.allgather_bytes - at_start_.allgather_bytes)));
  r_.step_time_s = seconds_since(start_);
  r_.peak_bytes = t_.meter_.stats().peak_bytes;
}

}  // namespace lt::trainers
