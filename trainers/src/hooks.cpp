#include "leantrain/trainers/hooks.h"

#include <string>

#include "leantrain/runtime/errors.h"
#include "leantrain/trainers/faults.h"
#include "leantrain/trainers/turns.h"

namespace lt::trainers {
namespace {

class EnvHooks final : public TrainerHooks {
 public:
  EnvHooks(FaultInjector faults, StepTurns turns) : faults_(std::move(faults)), turns_(std::move(turns)) {}

  void step_begin(int64_t step, int rank) override {
    // Note [Taking turns]: the turn is held from here until step_end, so the step's metrics,
    // evaluation and checkpoint all fall inside it.
    turns_.wait_turn();
    turn_held_ = true;
    faults_.at_step_start(step, rank);
  }
  void step_end(int64_t) override {
    if (turn_held_) turns_.end_turn();
    turn_held_ = false;
  }
  void run_end() override {
    if (!turns_.enabled()) return;
    if (turn_held_) turns_.end_turn();
    turn_held_ = false;
    turns_.wait_turn();  // the exit turn: the teardown stays out of the other side's steps
  }
  MicroBatchFault micro_batch_fault(int64_t step, int rank, bool last, int attempt) override {
    // oom: the first try of the step's last micro-batch; nan: every micro-batch of the step.
    if (last && attempt == 0 && faults_.fires(FaultKind::kOom, step, rank)) return MicroBatchFault::kOutOfMemory;
    if (faults_.fires(FaultKind::kNan, step, rank)) return MicroBatchFault::kNanLoss;
    return MicroBatchFault::kNone;
  }
  CheckpointFault checkpoint_fault(int64_t step, int rank) override {
    if (faults_.fires(FaultKind::kCheckpointKill, step, rank)) return CheckpointFault::kKill;
    if (faults_.fires(FaultKind::kCheckpointFail, step, rank)) return CheckpointFault::kFail;
    return CheckpointFault::kNone;
  }

 private:
  FaultInjector faults_;
  StepTurns turns_;
  bool turn_held_ = false;
};

}  // namespace

std::shared_ptr<TrainerHooks> hooks_from_env(int world_size) {
  auto faults = FaultInjector::from_env();
  StepTurns turns = StepTurns::from_env();
  if (turns.enabled() && world_size > 1)
    throw ConfigError("LEANTRAIN_BENCH_TURNS is for one-process runs (this run has " + std::to_string(world_size) +
                      " ranks)");
  return std::make_shared<EnvHooks>(std::move(faults), std::move(turns));
}

}  // namespace lt::trainers
