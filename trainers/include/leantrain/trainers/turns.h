#pragma once
// Note [Taking turns]: a benchmark harness (bench/peers/compare.py) may run leantrain and a
// peer process side by side on one machine and let them take turns, one optimizer step at a
// time, so that a slow window of the machine (another tenant on the same cores) falls on both
// sides' steps alike instead of on whichever whole run it hit. LEANTRAIN_BENCH_TURNS=GO:DONE
// names two FIFOs: before each step the trainer reads one byte from GO (its turn), after the
// step (its metrics, evaluation and checkpoint included) it writes one byte to DONE; after the
// last step it waits for one more turn before it evaluates nothing further and exits, so its
// teardown does not run inside the other side's step. Unset, nothing changes. If the harness
// goes away (end of file on GO, or DONE without a reader), the run goes on without turns: a
// vanished harness never leaves it hanging.
#include <string>

namespace lt::trainers {

class StepTurns {
 public:
  // From LEANTRAIN_BENCH_TURNS; disabled when unset or empty. Throws ConfigError on a value
  // that is not GO:DONE or a FIFO that cannot be opened.
  static StepTurns from_env();
  StepTurns() = default;
  StepTurns(const std::string& go_path, const std::string& done_path);
  StepTurns(const StepTurns&) = delete;
  StepTurns& operator=(const StepTurns&) = delete;
  StepTurns(StepTurns&& o) noexcept;
  StepTurns& operator=(StepTurns&& o) noexcept;
  ~StepTurns();

  bool enabled() const { return go_ >= 0; }
  void wait_turn();  // blocks until the harness grants a turn
  void end_turn();   // hands the turn back

 private:
  void close_all();
  void harness_gone();  // warns, then runs on without turns
  int go_ = -1, done_ = -1;
};

}  // namespace lt::trainers
