#pragma once
// The memory planner (docs/PLANNER.md): the fastest (precision, activation checkpoint policy,
// micro-batch) that fits a per-rank memory budget, found by measurement. It probes a few
// micro-steps of each candidate under the budget as a hard limit, fits a linear memory model
// (fixed + per_sample x micro_batch) and a linear time model per (precision, policy), and
// picks the highest predicted samples/s whose peak stays below (1 - margin) x budget. The
// global batch is kept; accumulation follows. Torch-free header.
#include <cstdint>
#include <string>
#include <vector>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/metrics.h"

namespace lt::comm {
class Communicator;
}

namespace lt::trainers {

struct PlanOptions {
  int64_t budget = 0;         // bytes per rank, > 0
  double margin = 0.10;       // the chosen peak (measured and predicted) <= (1 - margin) x budget
  int64_t measure_steps = 2;  // timed micro-steps per probe, after one warm-up
  std::vector<std::string> precisions;  // empty: fp32, and bf16 where the device runs it
  std::vector<std::string> policies = {"none", "selective", "full"};
  // Note [Slow candidates] (planner.cpp): a (precision, policy) whose first warm-up forward
  // takes more than slow_factor x the fastest warm-up forward so far (per sample, micro-batch
  // 1) is not probed further, nor are the later policies of that precision. 0: probe all.
  double slow_factor = 4.0;
  // ... and whose warm-up forward took at least this long per sample: below it a probe is
  // cheap, and the first forward's one-time costs (autocast, kernel set-up) dominate it.
  double slow_min_s = 0.5;
  // Model-state options, "shard/optimizer_state" (memory.shard, memory.optimizer_state), in the
  // order of preference: a candidate runs under the first one it fits with (Note [Model state
  // in the plan]). Empty: the config's values, "auto" standing for every value (none,
  // optimizer, gradients on several ranks; fp32, int8 with AdamW), FP32 state first.
  std::vector<std::string> states;
};

/// One candidate: probed (measured) or, past a pruned point, predicted only.
struct PlanRow {
  std::string precision, policy;
  int64_t micro_batch = 0, accumulation = 0;
  // The model-state option it runs under (memory.shard, memory.optimizer_state): the first of
  // PlanOptions::states under which its peaks fit, else the last; its peaks are under it.
  std::string shard = "none", optimizer_state = "fp32";
  bool probed = false;           // measured
  bool oom = false;              // its probe ran out of memory under the budget
  bool slow = false;             // not probed: its (precision, policy) was found slow
  bool skipped = false;          // not probed: dominated by a probed candidate that fits (Note [Probe order],
                                 // Note [Recomputation is dominated])
  int64_t measured_peak = -1;    // bytes; -1 when not measured
  int64_t predicted_peak = -1;   // bytes; -1 when the model has no fit
  double measured_sps = -1;      // samples/s of a whole step (accumulation micro-steps + update)
  double predicted_sps = -1;
  bool fits = false;             // measured, and both peaks <= limit
  // The analytic attention term of the row's (precision, policy) (models/attention_memory.h):
  // the [B,H,T,T] bytes per sample its attention cores keep for backward (0 under a fused
  // SDPA kernel or without attention), and the lower bound it gives the peak, fixed part +
  // (term + one layer's transient) x micro_batch (-1 without a term). Note [Attention floor]
  // in planner.cpp.
  int64_t attention_bytes_per_sample = 0;
  int64_t floor_peak = -1;
  bool attention_pruned = false;  // not probed: floor_peak is over the limit
  // "none": not probed, because under a fused SDPA kernel `selective` keeps exactly what
  // `none` keeps; its predictions are none's (Note [Selective under a fused kernel]).
  std::string same_as;
};

/// The fitted models of one (precision, policy).
struct PlanFit {
  std::string precision, policy;
  double fixed_bytes = 0, per_sample_bytes = 0;  // peak = fixed + per_sample x micro_batch
  double micro_fixed_s = 0, micro_per_sample_s = 0;  // forward+backward of one micro-batch
  double update_s = 0;                                // the optimizer step, once per step
  int points = 0;                                     // probes the fit uses
  // The first warm-up forward at micro-batch 1, per sample (-1: it did not complete); slow
  // when it was over slow_factor x the fastest one before it (Note [Slow candidates]).
  double warmup_forward_s = -1;
  bool slow = false;
  // Not probed: `none` of the same precision fits at the whole per-rank batch, and a
  // checkpointing policy at the same micro-batch only adds recomputation (Note
  // [Recomputation is dominated]).
  bool dominated = false;
  // The attention core that runs ("plain", "sdpa: flash attention", ...; empty without
  // attention) and its analytic term, bytes per sample (PlanRow::attention_bytes_per_sample).
  std::string attention_core;
  int64_t attention_bytes_per_sample = 0;
  std::string same_as;  // "none": this pair was not probed, it is none's (PlanRow::same_as)
};

struct Plan {
  int64_t budget = 0, limit = 0;  // limit = (1 - margin) x budget
  double margin = 0;
  double slow_factor = 0;  // PlanOptions::slow_factor
  int world_size = 1;
  int64_t global_batch = 0;
  int64_t fixed_minimum = 0;  // parameters + gradients + optimizer state (+ what is allocated), unsharded FP32
  std::vector<std::string> states;      // PlanOptions::states as searched
  std::vector<int64_t> state_savings;   // bytes each saves per rank against the probes (Note [Model state in the plan])
  std::string device;
  std::vector<PlanRow> rows;
  std::vector<PlanFit> fits;
  int chosen = -1;  // index into rows
  const PlanRow& choice() const { return rows.at(static_cast<size_t>(chosen)); }
};

/// Probes and chooses. Throws ConfigError naming memory.budget when the budget is below the
/// fixed part (the message gives the minimum) or when no candidate fits (the message gives
/// the smallest measured peak and the budget it needs).
Plan make_plan(const Config& cfg, const RuntimeContext& ctx, int world_size, const PlanOptions& opt);

/// One choice for every rank (train --auto under mpirun): rank 0 plans on its device for
/// comm.size() ranks and broadcasts its choice; the others get a Plan holding only the
/// chosen row. A ConfigError on rank 0 (nothing fits) becomes a ConfigError on every rank.
Plan agree_on_plan(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm, const PlanOptions& opt);

/// The table printed by `leantrain plan`: one line per candidate, the choice marked.
std::string plan_table(const Plan& plan);
/// plan.json: budget, margin, the choice (with the --set lines that reproduce it), every
/// candidate and every fit.
std::string plan_to_json(const Plan& plan);
/// The --set overrides of the choice (precision.mode, memory.recompute,
/// train.micro_batch, train.global_batch, memory.shard, memory.optimizer_state, memory.budget).
std::vector<std::string> plan_overrides(const Plan& plan);
/// The `plan` metrics event: budget, margin, the choice and its predicted/measured numbers.
MetricFields plan_event(const Plan& plan);

}  // namespace lt::trainers
