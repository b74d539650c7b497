#include "leantrain/trainers/schedule.h"

#include <algorithm>
#include <cmath>

namespace lt::trainers {

double lr_scale(const TrainConfig& t) {
  if (t.lr_scaling != "linear" || t.lr_reference_batch <= 0) return 1.0;
  return static_cast<double>(t.global_batch) / static_cast<double>(t.lr_reference_batch);
}

double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps) {
  const double lr = t.lr * lr_scale(t), min_lr = t.min_lr * lr_scale(t);
  if (t.warmup_steps > 0 && step < t.warmup_steps)
    return lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  if (t.schedule == "constant") return lr;
  const int64_t decay = std::max<int64_t>(1, total_steps - t.warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - t.warmup_steps) / static_cast<double>(decay), 0.0, 1.0);
  return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace lt::trainers
