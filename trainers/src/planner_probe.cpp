// What the planner measures and counts: the probe, one candidate's training steps (Note
// [Planner probe]); the fixed part of every candidate; the model-state options (memory.shard x
// memory.optimizer_state, Note [Model state in the plan]) and the 8-bit update's cost.
#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <thread>
#include <tuple>

#include "leantrain/comm/communicator.h"
#include "leantrain/models/registry.h"
#include "leantrain/optim/optimizer.h"
#include "leantrain/optim/quantized_state.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/trainers/precision.h"
#include "leantrain/trainers/trainer.h"
#include "planner_internal.h"

namespace lt::trainers::planner_detail {
namespace {

using Clock = std::chrono::steady_clock;

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Note [Planner probe]: a probe is the training step itself (Trainer::train_step, the one
// `leantrain train` runs) of the candidate at micro-batch m on one process, with accumulation
// min(A, 2): from the second micro-batch on the gradients stay allocated while the forward
// runs, which is the worst position of every accumulating step, so two micro-batches show the
// peak of A. The step ends with the update, so the peak covers parameters, gradients,
// optimizer state (and its update temporaries), the batch and the activations of one
// micro-batch (and any tensor a data set holds, as in training). One warm-up step first
// (allocates the optimizer state, warms the allocator and lazy initialisation), then
// measure_steps timed ones; each step's compute time over its micro-batches gives the time of
// one micro-batch, its update time the rest. A multi-rank candidate keeps its gradients
// allocated across steps, as the gradient buckets do (TrainerOptions::hold_gradients); the
// candidate of one rank without accumulation frees them before its only forward
// (zero_grad(set_to_none) at the step's start; Note [Gradients stay in the buckets] in
// trainer.cpp), so its peak is lower than the worst-position peak by up to the gradients
// (GPT-12L seq 512, full checkpointing: 2.00 GiB at 2x1 vs 2.30 GiB at 1x2).

/// The candidate's configuration as one process runs it in a probe (Note [Planner probe]).
Config probe_config(const Config& cfg, const std::string& precision, const std::string& policy, int64_t micro,
                    int64_t accumulation, int64_t steps) {
  Config pc = cfg;
  pc.precision.mode = precision;
  pc.memory.recompute = policy;
  pc.memory.budget = "0";  // the planner's own budget is in force (BudgetScope)
  // Unsharded FP32 state: the options' savings are applied to its peaks (Note [Model state in the plan]).
  pc.memory.shard = "none";
  pc.memory.optimizer_state = "fp32";
  pc.train.micro_batch = micro;
  pc.train.global_batch = micro * std::min<int64_t>(accumulation, 2);
  pc.train.steps = steps;
  pc.checkpoint.dir.clear();  // no checkpoints
  return pc;
}

}  // namespace

ProbeDelay probe_delay_from_env() {
  ProbeDelay d;
  const char* v = std::getenv("LEANTRAIN_PLANNER_DELAY");
  if (v == nullptr || *v == 0) return d;
  const std::string s = v;
  const auto colon = s.find(':');
  char* end = nullptr;
  const double sec = colon == std::string::npos ? -1 : std::strtod(s.c_str() + colon + 1, &end);
  if (colon == std::string::npos || end == nullptr || *end != 0 || !(sec >= 0))
    throw ConfigError("LEANTRAIN_PLANNER_DELAY = \"" + s + "\": expected PRECISION:SECONDS, e.g. bf16:0.05");
  d.precision = s.substr(0, colon);
  d.seconds_per_sample = sec;
  return d;
}

double first_forward_s(models::Model& model, const data::Dataset& train, const std::string& precision,
                       const torch::Device& device, const ProbeDelay& delay) {
  auto batch = train.get({0}, 0);
  auto input = batch.input.to(device), target = batch.target.to(device);
  sync(device);
  const auto t0 = Clock::now();
  {
    AutocastGuard ac(precision, device.type());
    model.forward_loss_with(input, target, data::fields_on(batch, device));  // the graph is freed here: no backward
  }
  if (delay.precision == precision)
    std::this_thread::sleep_for(std::chrono::duration<double>(delay.seconds_per_sample));
  sync(device);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

Probe run_probe(const Config& cfg, const RuntimeContext& ctx, const std::shared_ptr<models::Model>& model,
                const std::shared_ptr<data::Dataset>& train, const std::string& precision, const std::string& policy,
                int64_t micro, int64_t accumulation, int world_size, int64_t steps, const ProbeDelay& delay) {
  // The gradients the probe leaves on the model go with it, fitting or not.
  struct FreeGradients {
    models::Model& m;
    ~FreeGradients() {
      for (auto& p : m.parameters()) p.mutable_grad() = torch::Tensor();
    }
  } free_gradients{*model};
  comm::LocalCommunicator local;
  TrainerOptions opt;
  opt.oom_backoff = false;
  opt.hold_gradients = world_size > 1;
  Trainer trainer(probe_config(cfg, precision, policy, micro, accumulation, steps + 1),
                  Components{model, train, nullptr, "probe"}, ctx, local, opt);
  Probe p;
  trainer.train_step(0);  // warm-up
  for (int64_t i = 1; i <= steps; ++i) {
    const StepResult r = trainer.train_step(i);
    p.peak = std::max(p.peak, r.peak_bytes);
    p.micro_s += r.compute_s / static_cast<double>(r.accumulation);
    p.update_s += r.update_s;
    if (delay.precision == precision) p.micro_s += delay.seconds_per_sample * static_cast<double>(micro);
  }
  p.micro_s /= static_cast<double>(steps);
  p.update_s /= static_cast<double>(steps);
  return p;
}

/// The element counts of the model's parameters, on a model built (seeded) for the count alone.
std::vector<int64_t> parameter_counts(const Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.data.seed));
  auto probe_model = models::build_model(cfg.model);
  return optim::parameter_numels(*probe_model);
}

// Note [Budget minimum] in trainer.cpp, for the planner: the fixed part of every candidate.
/// What is allocated now (data and buffers), the parameters, their gradients, the optimizer
/// state and the gradient buckets (comm_bytes). A ConfigError when the budget is below it.
/// `saving`: what the most saving model-state option takes off it (Note [Model state in the plan]).
int64_t checked_fixed_minimum(const TrainConfig& t, const MemoryMeter& meter, int64_t param_bytes,
                              int64_t comm_bytes, int64_t budget, int64_t saving, const std::string& saver) {
  const int64_t fixed_minimum = meter.stats().current_bytes + param_bytes /*parameters*/ +
                                param_bytes /*gradients*/ + optim::optimizer_state_bytes(t, param_bytes) + comm_bytes;
  if (budget < fixed_minimum - saving)
    throw ConfigError("memory.budget = " + bytes_text(budget) + " is below the fixed part of every candidate, " +
                      bytes_text(fixed_minimum - saving) + " (parameters " + format_bytes(param_bytes) +
                      ", gradients " + format_bytes(param_bytes) + ", optimizer state " +
                      format_bytes(optim::optimizer_state_bytes(t, param_bytes)) + ", data and buffers" +
                      (saving > 0 ? "; less " + format_bytes(saving) + " under memory.shard/optimizer_state " + saver
                                  : std::string()) +
                      "): give --memory-budget at least " + std::to_string(fixed_minimum - saving) +
                      " bytes plus room for activations");
  return fixed_minimum;
}

// Note [Model state in the plan]
// Besides precision x recompute x micro-batch, a candidate runs under a model-state option:
// memory.shard (none | optimizer | gradients, several ranks) x memory.optimizer_state (fp32 |
// int8, AdamW), PlanOptions::states in the order of preference. What an option changes is the
// fixed part of a rank's memory: gradients, the optimizer state and the gradient buckets
// (model_state_bytes: the optimizer state / N, the buckets' chunks P / N and about three
// buckets of live gradients with sharded gradients, a quarter of the moments' bytes in 8
// bits), not the activations. A probe holds its gradients, the FP32 state and (counted on top)
// the buckets; a multi-rank run keeps its gradients in the buckets, so every option, none/fp32
// too, saves at least that copy. So the probes run as before, unsharded with FP32 state (rank 0 alone cannot
// shard anyway), under the budget raised by the largest saving, and each candidate is then
// given the first option under which its measured and predicted peaks, less that option's
// saving, are under the limit (rows show the peaks under the option). An option is never
// faster than the one before it: sharding moves the all-reduce's bytes (stage 1) or more
// (stage 2 with accumulation, a reduce-scatter per micro-batch), 8-bit moments cost a
// dequantise/quantise pass (its factor on the update time is measured at the start); so the
// choice, the highest predicted samples/s, takes a model-state technique only when it lets a
// faster precision, policy or micro-batch fit, or when nothing fits without it. The budget
// minimum refused up front is the fixed part under the most saving option. The savings are
// exact for the optimizer state (8-bit: per tensor, the small ones FP32) and the buckets'
// chunks; sharded gradients are counted as three buckets (3 x comm.bucket_mb) of live gradients,
// which overstates the peak of a model smaller than that (its gradients are freed bucket by
// bucket in backward, while its activations shrink): the prediction errs on the safe side.

namespace {

/// A model-state option "shard/optimizer_state" split into its memory.shard and
/// memory.optimizer_state values.
std::pair<std::string, std::string> split_state(const std::string& state) {
  const auto slash = state.find('/');
  return {state.substr(0, slash), state.substr(slash + 1)};
}

}  // namespace

/// The bytes each option of `states` saves per rank against what the probes hold.
std::vector<int64_t> state_savings(const Config& cfg, const std::vector<std::string>& states,
                                   const std::vector<int64_t>& numels, int world) {
  auto total = [&](const std::string& state) {
    Config c = cfg;
    std::tie(c.memory.shard, c.memory.optimizer_state) = split_state(state);
    const auto b = optim::model_state_bytes(c, numels, world);
    return b.gradients + b.optimizer + b.comm;
  };
  // What a probe holds: its gradients (kept across steps for a multi-rank candidate), the
  // FP32 optimizer state, and the buckets counted on top (comm_bytes). A real multi-rank run
  // keeps its gradients in the buckets, so even "none/fp32" saves one copy there.
  const int64_t param_bytes = optim::fp32_bytes(numels);
  const int64_t base = param_bytes + optim::optimizer_state_bytes(cfg.train, param_bytes) + (world > 1 ? param_bytes : 0);
  std::vector<int64_t> out;
  for (const auto& st : states) out.push_back(base - total(st));
  return out;
}

/// PlanOptions::states, else the options the config allows: memory.shard and
/// memory.optimizer_state as set, "auto" for every value (8-bit moments with AdamW only; a
/// world of one shards nothing), in the order none < optimizer < gradients, fp32 < int8.
std::vector<std::string> candidate_states(const Config& cfg, const PlanOptions& opt, int world) {
  if (!opt.states.empty()) return opt.states;
  std::vector<std::string> shards = {cfg.memory.shard}, precisions = {cfg.memory.optimizer_state};
  if (cfg.memory.shard == "auto") shards = {"none", "optimizer", "gradients"};
  if (world == 1) shards = {"none"};
  if (cfg.memory.optimizer_state == "auto")
    precisions = cfg.train.optimizer == "adamw" ? std::vector<std::string>{"fp32", "int8"} : std::vector<std::string>{"fp32"};
  std::vector<std::string> states;
  for (const auto& p : precisions)
    for (const auto& sh : shards) states.push_back(sh + "/" + p);
  return states;
}

/// How much longer an AdamW update takes with 8-bit moments than with FP32 ones, measured on
/// 2^20 elements on the device (Note [Model state in the plan]).
double int8_update_factor(const torch::Device& device) {
  torch::NoGradGuard no_grad;
  const auto o = torch::TensorOptions().dtype(torch::kFloat).device(device);
  const int64_t n = int64_t{1} << 20;
  auto p = torch::randn({n}, o), g = torch::randn({n}, o), m = torch::zeros({n}, o), v = torch::zeros({n}, o);
  auto qm = optim::quantized_zeros(n, true, o), qv = optim::quantized_zeros(n, false, o);
  auto step = torch::full({}, 1.0, o);
  auto time = [&](const std::function<void()>& f) {
    f();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) f();
    if (device.is_cuda()) torch::cuda::synchronize(device.index());  // the run's device, not the thread's
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double fp32 = time([&] {
    std::vector<torch::Tensor> ps{p}, gs{g}, ms{m}, vs{v}, ss{step};
    at::_fused_adamw_(ps, gs, ms, vs, {}, ss, 1e-3, 0.9, 0.95, 0.1, 1e-8, false, false, std::nullopt, std::nullopt);
  });
  const double int8 = time([&] { optim::adamw_step_8bit(p, g, qm, qv, step, 1e-3, 0.9, 0.95, 0.1, 1e-8, std::nullopt); });
  return fp32 > 0 ? std::max(1.0, int8 / fp32) : 1.0;
}

/// Settles each candidate's model-state option (Note [Model state in the plan]): its peaks
/// under the first option they fit with, `fits` against the limit, and the 8-bit update's
/// cost in its predicted samples/s.
void assign_states(Plan& plan, const std::vector<PlanFit>& fits, double int8_factor) {
  for (auto& row : plan.rows) {
    size_t k = 0;
    const bool known = row.predicted_peak >= 0;
    for (; k + 1 < plan.states.size(); ++k) {
      const int64_t sav = plan.state_savings[k];
      if (known && row.predicted_peak - sav <= plan.limit && (!row.probed || row.measured_peak - sav <= plan.limit))
        break;
    }
    const int64_t sav = plan.state_savings[k];
    std::tie(row.shard, row.optimizer_state) = split_state(plan.states[k]);
    if (row.probed) row.measured_peak -= sav;
    if (known) row.predicted_peak -= sav;
    if (row.floor_peak >= 0) row.floor_peak -= sav;
    row.fits = row.fits && row.measured_peak <= plan.limit && row.predicted_peak <= plan.limit;
    if (row.optimizer_state == "int8" && row.predicted_sps > 0)
      for (const auto& f : fits)
        if (f.precision == row.precision && f.policy == row.policy && f.update_s > 0)
          row.predicted_sps = static_cast<double>(plan.global_batch) /
                              (static_cast<double>(plan.global_batch) / row.predicted_sps + f.update_s * (int8_factor - 1));
  }
}

}  // namespace lt::trainers::planner_detail
