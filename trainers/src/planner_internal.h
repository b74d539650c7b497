#pragma once
// What the planner's files share (planner.h is the public side): the search (planner.cpp)
// calls what measures and counts (planner_probe.cpp: the probe, the fixed part, the
// model-state options); the output formats (planner_format.cpp) and the multi-rank agreement
// (planner_agree.cpp) read only the Plan. Private to trainers/; torch-free (the formats compile without LibTorch).
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/planner.h"

namespace c10 {
struct Device;
}
namespace lt::data {
class Dataset;
}
namespace lt::models {
class Model;
}

namespace lt::trainers::planner_detail {

/// `v` printed with the printf format `f` (one double).
inline std::string fmt(double v, const char* f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

inline std::string bytes_text(int64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

// --- The probe (planner_probe.cpp) ---

/// What a probe of one candidate measured.
struct Probe {
  int64_t peak = 0;
  double micro_s = 0;   // forward+backward of one micro-batch, averaged
  double update_s = 0;  // the optimizer step, averaged
};

// Test-only: LEANTRAIN_PLANNER_DELAY="PRECISION:SECONDS" makes that precision slow on purpose
// (Note [Slow candidates]): the timed first forward of each pair sleeps SECONDS, and every
// probe's micro-batch time counts SECONDS x micro-batch more.
struct ProbeDelay {
  std::string precision;
  double seconds_per_sample = 0;
};

ProbeDelay probe_delay_from_env();

/// The timed forward of Note [Slow candidates], per sample.
double first_forward_s(models::Model& model, const data::Dataset& train, const std::string& precision,
                       const c10::Device& device, const ProbeDelay& delay);

/// Runs the probe of one candidate on `model` (built for the pair). An out-of-memory error
/// propagates: the candidate does not fit (Note [Planner probe]).
Probe run_probe(const Config& cfg, const RuntimeContext& ctx, const std::shared_ptr<models::Model>& model,
                const std::shared_ptr<data::Dataset>& train, const std::string& precision, const std::string& policy,
                int64_t micro, int64_t accumulation, int world_size, int64_t steps, const ProbeDelay& delay);

// --- The fixed part and the model-state options (planner_probe.cpp) ---

/// The element counts of the model's parameters, on a model built (seeded) for the count alone.
std::vector<int64_t> parameter_counts(const Config& cfg);

/// What is allocated now (data and buffers), the parameters, their gradients, the optimizer
/// state and the gradient buckets (comm_bytes). A ConfigError when the budget is below it.
/// `saving`: what the most saving model-state option takes off it (Note [Model state in the plan]).
int64_t checked_fixed_minimum(const TrainConfig& t, const MemoryMeter& meter, int64_t param_bytes,
                              int64_t comm_bytes, int64_t budget, int64_t saving, const std::string& saver);

/// The bytes each option of `states` saves per rank against what the probes hold.
std::vector<int64_t> state_savings(const Config& cfg, const std::vector<std::string>& states,
                                   const std::vector<int64_t>& numels, int world);

/// PlanOptions::states, else the options the config allows.
std::vector<std::string> candidate_states(const Config& cfg, const PlanOptions& opt, int world);

/// How much longer an AdamW update takes with 8-bit moments than with FP32 ones, measured on
/// the device.
double int8_update_factor(const c10::Device& device);

/// Settles each candidate's model-state option: its peaks under the first option they fit
/// with, `fits` against the limit, and the 8-bit update's cost in its predicted samples/s.
void assign_states(Plan& plan, const std::vector<PlanFit>& fits, double int8_factor);

}  // namespace lt::trainers::planner_detail
