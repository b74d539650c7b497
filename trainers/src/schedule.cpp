#include "leantrain/trainers/schedule.h"

#include <algorithm>
#include <cmath>

namespace lt::trainers {

double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps) {
  if (t.warmup_steps > 0 && step < t.warmup_steps)
    return t.lr * static_cast<double>(step + 1) / static_cast<double>(t.warmup_steps);
  if (t.schedule == "constant") return t.lr;
  const int64_t decay = std::max<int64_t>(1, total_steps - t.warmup_steps);
  const double progress =
      std::clamp(static_cast<double>(step - t.warmup_steps) / static_cast<double>(decay), 0.0, 1.0);
  return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace lt::trainers
