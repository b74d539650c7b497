#pragma once
// Learning-rate schedule as a pure function of the step, so a resumed run and any rank
// compute the same value without state.
#include <cstdint>

#include "leantrain/runtime/config.h"

namespace lt::trainers {

/// Linear warmup from lr/warmup to lr over train.warmup_steps, then cosine decay to
/// train.min_lr at total_steps (or constant at lr for schedule = "constant").
double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps);

}  // namespace lt::trainers
