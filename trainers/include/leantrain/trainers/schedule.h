#pragma once
// Learning-rate schedule as a pure function of the step, so a resumed run and any rank
// compute the same value without state.
#include <cstdint>

#include "leantrain/runtime/config.h"

namespace lt::trainers {

/// The factor train.lr and train.min_lr are multiplied by: global_batch / lr_reference_batch
/// with train.lr_scaling = "linear" (Goyal et al.'s rule, opt-in), else 1.
double lr_scale(const TrainConfig& t);

/// Linear warmup from lr/warmup to lr over train.warmup_steps, then cosine decay to
/// train.min_lr at total_steps (or constant at lr for schedule = "constant"); both lr and
/// min_lr times lr_scale(t).
double lr_at(const TrainConfig& t, int64_t step, int64_t total_steps);

}  // namespace lt::trainers
