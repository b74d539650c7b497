#include "leantrain/trainers/step_policies.h"

#include <cmath>
#include <utility>

#include "leantrain/runtime/errors.h"

namespace lt::trainers {

int64_t backoff_micro_batch(int64_t micro) {
  for (int64_t d = micro / 2; d >= 1; --d)
    if (micro % d == 0) return d;
  return 0;
}

NonfinitePolicy::NonfinitePolicy(std::string mode, int64_t max_skips, bool scaler_handles_it)
    : mode_(std::move(mode)), max_skips_(max_skips), scaler_handles_it_(scaler_handles_it) {}

bool NonfinitePolicy::skip_update(int64_t step, double loss, const std::string& checkpoint_dir) {
  if (scaler_handles_it_ || std::isfinite(loss)) {
    in_a_row_ = 0;
    return false;
  }
  ++in_a_row_;
  if (mode_ == "stop" || in_a_row_ > max_skips_)
    throw TrainingStopped("step " + std::to_string(step) + ": the training loss is " + std::to_string(loss) +
                          (mode_ == "stop" ? std::string(" (train.nonfinite = \"stop\")")
                                           : " in " + std::to_string(in_a_row_) +
                                                 " steps in a row (train.nonfinite_max_skips = " +
                                                 std::to_string(max_skips_) + ")") +
                          "; the update was not applied, the checkpoints in " + checkpoint_dir +
                          " are intact; lower train.lr, enable train.grad_clip, or set train.nonfinite = \"skip\"");
  return true;
}

}  // namespace lt::trainers
