#include "leantrain/trainers/planner.h"
#include "leantrain/trainers/quantized_state.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <thread>

#include <nlohmann/json.hpp>

#include "leantrain/comm/communicator.h"
#include "leantrain/data/dataset.h"
#include "leantrain/data/registry.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/attention_memory.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/optimizer.h"
#include "leantrain/trainers/precision.h"
#include "leantrain/trainers/trainer.h"

namespace lt::trainers {
namespace {

using Clock = std::chrono::steady_clock;

std::string bytes_text(int64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

/// Lifts the budget when the planner is done (its probes ran under it as a hard limit).
struct BudgetScope {
  MemoryMeter& meter;
  BudgetScope(MemoryMeter& m, int64_t bytes) : meter(m) { meter.set_budget(bytes); }
  ~BudgetScope() { meter.set_budget(0); }
};

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

void sync(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

/// The timed forward of Note [Slow candidates], per sample.
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
  pc.memory.activation_checkpoint = policy;
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

/// Runs the probe of one candidate on `model` (built for the pair). An out-of-memory error
/// propagates: the candidate does not fit.
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

/// Least squares y = a + b x; with one point, a is `intercept_if_one`.
std::pair<double, double> fit_line(const std::vector<double>& x, const std::vector<double>& y,
                                   double intercept_if_one) {
  const size_t n = x.size();
  if (n == 0) return {0, 0};
  if (n == 1) return {intercept_if_one, (y[0] - intercept_if_one) / x[0]};
  double mx = 0, my = 0;
  for (size_t i = 0; i < n; ++i) mx += x[i], my += y[i];
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxy = 0, sxx = 0;
  for (size_t i = 0; i < n; ++i) sxy += (x[i] - mx) * (y[i] - my), sxx += (x[i] - mx) * (x[i] - mx);
  const double b = sxx > 0 ? sxy / sxx : 0;
  return {my - b * mx, b};
}

// One row of the candidate table, before it is probed.
PlanRow make_row(const std::string& precision, const std::string& policy, int64_t micro_batch, int64_t per_rank) {
  PlanRow row;
  row.precision = precision;
  row.policy = policy;
  row.micro_batch = micro_batch;
  row.accumulation = per_rank / micro_batch;
  return row;
}

std::string fmt(double v, const char* f) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// The per-rank batch, once the budget, the margin and the global batch are checked.
int64_t checked_per_rank_batch(const TrainConfig& t, int world_size, const PlanOptions& opt) {
  if (opt.budget <= 0)
    throw ConfigError("leantrain plan needs a budget: --memory-budget SIZE (or memory.budget), e.g. 8GiB");
  if (!(opt.margin >= 0 && opt.margin < 1))
    throw ConfigError("--margin " + std::to_string(opt.margin) + ": must be in [0, 1), e.g. 0.1");
  const int64_t per_rank = t.global_batch / world_size;
  if (per_rank <= 0 || t.global_batch % world_size != 0)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) + " must be a multiple of the " +
                      std::to_string(world_size) + " ranks");
  return per_rank;
}

/// A plan with its budget, limit and device, before any candidate.
Plan empty_plan(const PlanOptions& opt, int world_size, int64_t global_batch, const MemoryMeter& meter) {
  Plan plan;
  plan.budget = opt.budget;
  plan.margin = opt.margin;
  plan.slow_factor = opt.slow_factor;
  plan.limit = static_cast<int64_t>(static_cast<double>(opt.budget) * (1.0 - opt.margin));
  plan.world_size = world_size;
  plan.global_batch = global_batch;
  plan.device = meter.device_name();
  return plan;
}

/// The precisions to probe: the options' own, else fp32 and bf16 where the device runs it.
std::vector<std::string> candidate_precisions(const PlanOptions& opt, const torch::Device& device) {
  std::vector<std::string> precisions = opt.precisions;
  if (precisions.empty()) {
    precisions.push_back("fp32");
    try {
      check_precision_supported("bf16", device);
      precisions.push_back("bf16");
    } catch (const ConfigError& e) {
      log::info(std::string("planner: bf16 skipped: ") + e.what());
    }
  }
  return precisions;
}

/// The micro-batches to probe: the powers of two dividing the per-rank batch.
std::vector<int64_t> candidate_micro_batches(int64_t per_rank) {
  std::vector<int64_t> micros;
  for (int64_t m = 1; m <= per_rank; m *= 2)
    if (per_rank % m == 0) micros.push_back(m);
  return micros;
}

/// The element counts of the model's parameters, on a model built (seeded) for the count alone.
std::vector<int64_t> parameter_counts(const Config& cfg) {
  torch::manual_seed(static_cast<uint64_t>(cfg.data.seed));
  auto probe_model = models::build_model(cfg.model);
  return parameter_numels(*probe_model);
}

// Note [Budget minimum] in trainer.cpp, for the planner: the fixed part of every candidate.
/// What is allocated now (data and buffers), the parameters, their gradients, the optimizer
/// state and the gradient buckets (comm_bytes). A ConfigError when the budget is below it.
/// `saving`: what the most saving model-state option takes off it (Note [Model state in the plan]).
int64_t checked_fixed_minimum(const TrainConfig& t, const MemoryMeter& meter, int64_t param_bytes,
                              int64_t comm_bytes, int64_t budget, int64_t saving, const std::string& saver) {
  const int64_t fixed_minimum = meter.stats().current_bytes + param_bytes /*parameters*/ +
                                param_bytes /*gradients*/ + optimizer_state_bytes(t, param_bytes) + comm_bytes;
  if (budget < fixed_minimum - saving)
    throw ConfigError("memory.budget = " + bytes_text(budget) + " is below the fixed part of every candidate, " +
                      bytes_text(fixed_minimum - saving) + " (parameters " + format_bytes(param_bytes) +
                      ", gradients " + format_bytes(param_bytes) + ", optimizer state " +
                      format_bytes(optimizer_state_bytes(t, param_bytes)) + ", data and buffers" +
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

/// A model-state option "shard/optimizer_state" split into its memory.shard and
/// memory.optimizer_state values.
std::pair<std::string, std::string> split_state(const std::string& state) {
  const auto slash = state.find('/');
  return {state.substr(0, slash), state.substr(slash + 1)};
}

/// The bytes each option of `states` saves per rank against what the probes hold.
std::vector<int64_t> state_savings(const Config& cfg, const std::vector<std::string>& states,
                                   const std::vector<int64_t>& numels, int world) {
  auto total = [&](const std::string& state) {
    Config c = cfg;
    std::tie(c.memory.shard, c.memory.optimizer_state) = split_state(state);
    const auto b = model_state_bytes(c, numels, world);
    return b.gradients + b.optimizer + b.comm;
  };
  // What a probe holds: its gradients (kept across steps for a multi-rank candidate), the
  // FP32 optimizer state, and the buckets counted on top (comm_bytes). A real multi-rank run
  // keeps its gradients in the buckets, so even "none/fp32" saves one copy there.
  const int64_t param_bytes = fp32_bytes(numels);
  const int64_t base = param_bytes + optimizer_state_bytes(cfg.train, param_bytes) + (world > 1 ? param_bytes : 0);
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
  auto qm = quantized_zeros(n, true, o), qv = quantized_zeros(n, false, o);
  auto step = torch::full({}, 1.0, o);
  auto time = [&](const std::function<void()>& f) {
    f();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 3; ++i) f();
    if (device.is_cuda()) torch::cuda::synchronize();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  const double fp32 = time([&] {
    std::vector<torch::Tensor> ps{p}, gs{g}, ms{m}, vs{v}, ss{step};
    at::_fused_adamw_(ps, gs, ms, vs, {}, ss, 1e-3, 0.9, 0.95, 0.1, 1e-8, false, false, std::nullopt, std::nullopt);
  });
  const double int8 = time([&] { adamw_step_8bit(p, g, qm, qv, step, 1e-3, 0.9, 0.95, 0.1, 1e-8, std::nullopt); });
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

/// What the probes of every (precision, policy) share, and what the pairs probed so far found.
struct Planner {
  const Config& cfg;
  const RuntimeContext& ctx;
  const PlanOptions& opt;
  int world_size;
  torch::Device device;
  int64_t per_rank;
  std::vector<int64_t> micros;  // powers of two dividing the per-rank batch
  std::shared_ptr<data::Dataset> train;
  int64_t comm_bytes;  // the gradient buckets' flat buffers (0 at one rank)
  int64_t grad_bytes;  // one fp32 copy of the parameters: the gradients
  ProbeDelay delay;
  Plan& plan;
  // The analytic attention term of each "precision/policy" (Note [Attention floor]).
  std::map<std::string, models::AttentionMemory> attention;
  // The largest saving of the model-state options (Note [Model state in the plan]): the
  // probes, run unsharded with FP32 state, may measure up to the limit plus this much.
  int64_t slack = 0;
  double fastest_warmup = -1;             // per sample, over the pairs probed so far
  std::set<std::string> slow_precisions;  // Note [Slow candidates]
  std::set<std::string> none_fits_whole;  // Note [Recomputation is dominated]
};

/// What a probe (unsharded, FP32 state) may measure and still fit under some model-state option.
int64_t probe_limit(const Planner& s) { return s.plan.limit + s.slack; }

/// What the probes of one (precision, policy) measured, and where its probe order stands.
struct PairProbes {
  size_t first_row = 0;                    // the pair's first row in Plan::rows
  std::vector<double> xs, times, updates;  // every probe: the time model
  std::vector<double> line_xs, peaks;      // the probes on the memory line (not `solo`)
  size_t bound = 0;                        // micros[bound..] ran out of memory or exceeded the limit
  int largest_fit = -1;                    // the largest index measured under the limit
  // One rank, accumulation 1: the gradients are not held during the forward, so that
  // candidate is off the memory line (Note [Planner probe]); probed on its own, second.
  size_t last = 0;
  bool solo = false;
  double solo_peak = -1;  // its probe's peak (without the buckets)
};

/// A pair about to be probed: its rows start at the end of Plan::rows, none of them tried yet.
PairProbes start_pair(const Planner& s) {
  PairProbes pp;
  pp.first_row = s.plan.rows.size();
  pp.bound = s.micros.size();
  pp.last = s.micros.size() - 1;
  pp.solo = s.world_size == 1 && s.micros[pp.last] == s.per_rank;
  return pp;
}

// Note [Slow candidates]: a probe costs a few steps, which is nothing where a sample
// takes milliseconds and minutes where a precision runs a slow kernel path: bf16 matmuls on a
// CPU without AVX-512 BF16 go through a reference GEMM 10-20x slower than fp32 (GPT-2 small,
// seq 512: about a minute per sample). So before the first probe of each (precision, policy)
// at micro-batch 1, one forward of the fresh model is timed, and when that is over
// slow_factor (4) x the fastest such forward of the pairs probed before it, the probe stops
// there, the pair's rows are listed as `slow`, and the later policies of the same precision are
// listed as `slow` without a probe: at micro-batch 1 they run the same forward and recompute
// more. A forward under slow_min_s (0.5 s) a sample is never judged: such probes are cheap,
// and a first forward that short is dominated by one-time costs (the tiny GPT of the tests:
// bf16's first forward 4.5 ms, fp32's 1 ms, while its bf16 steps run at 0.7x fp32's speed).
// The rule compares like with like (each pair's first forward at micro-batch 1, each on a
// freshly built model) and gives up only what could win if a larger micro-batch sped the
// slow precision up by more than slow_factor relative to the fast one; memory does not enter
// it (a slow pair is not needed to fit: a precision is judged slow only after a faster one
// was measured). The cost of finding a pair slow is one forward of one sample.

/// Times the pair's first forward (at micro-batch 1, before its first probe) and judges it
/// against the fastest one so far: true when the pair is slow and is not probed further.
bool judged_slow(Planner& s, PlanFit& fit, models::Model& model) {
  const PlanOptions& opt = s.opt;
  fit.warmup_forward_s = first_forward_s(model, *s.train, fit.precision, s.device, s.delay);
  const double slow_above =
      opt.slow_factor > 0 && s.fastest_warmup > 0 ? std::max(opt.slow_factor * s.fastest_warmup, opt.slow_min_s) : 0;
  if (slow_above > 0 && fit.warmup_forward_s > slow_above) {
    fit.slow = true;
    s.slow_precisions.insert(fit.precision);
    log::info("planner: " + fit.precision + "/" + fit.policy + " is slow: warm-up forward " +
              fmt(fit.warmup_forward_s, "%.3g") + " s/sample > " + fmt(opt.slow_factor, "%g") + " x " +
              fmt(s.fastest_warmup, "%.3g") + " s/sample; not probed further (Note [Slow candidates])");
    return true;
  }
  if (s.fastest_warmup < 0 || fit.warmup_forward_s < s.fastest_warmup) s.fastest_warmup = fit.warmup_forward_s;
  return false;
}

// Note [Probe order]: micro-batch 1 first, then always the largest micro-batch the
// memory model (refitted after every probe) predicts under the limit, above the
// largest one measured to fit and below the smallest one that did not. The time model
// makes throughput grow with the micro-batch (samples/s = G / (P a / m + P b + u),
// a >= 0), so of a pair only its largest fitting micro-batch can be chosen; the ones
// between are predicted, not probed (`skipped`). A pair costs 2-3 probes, not one per
// micro-batch. At one rank the accumulation-1 candidate (micro-batch = the batch) is
// probed second, on its own: its peak is below the line (Note [Planner probe]), so it can
// fit where micro-batch 1 did not; when it fits, every smaller one is skipped.

/// The index of the pair's next micro-batch to probe; -1 when none is left.
int next_probe(const Planner& s, const PairProbes& pp) {
  const Plan& plan = s.plan;
  auto tried = [&](size_t k) {
    const PlanRow& r = plan.rows[pp.first_row + k];
    return r.probed || r.oom || r.attention_pruned;
  };
  if (!tried(0)) return 0;
  if (pp.solo && !tried(pp.last)) return static_cast<int>(pp.last);
  const auto [a, b] = fit_line(pp.line_xs, pp.peaks, static_cast<double>(plan.fixed_minimum));
  for (int i = static_cast<int>(std::min(pp.bound, pp.solo ? pp.last : s.micros.size())) - 1; i > pp.largest_fit; --i)
    if (!tried(static_cast<size_t>(i)) &&
        a + b * static_cast<double>(s.micros[static_cast<size_t>(i)]) + static_cast<double>(s.comm_bytes) <=
            static_cast<double>(probe_limit(s)))
      return i;
  return -1;
}

/// Enters the probe of the pair's micro-batch micros[k] in its row and in the pair's lines.
void record_probe(Planner& s, PairProbes& pp, size_t k, const Probe& p) {
  PlanRow& row = s.plan.rows[pp.first_row + k];
  const bool off_line = pp.solo && k == pp.last;
  const auto m = static_cast<double>(s.micros[k]);
  row.probed = true;
  row.measured_peak = p.peak + s.comm_bytes;
  row.measured_sps = static_cast<double>(s.cfg.train.global_batch) /
                     (static_cast<double>(row.accumulation) * p.micro_s + p.update_s);
  pp.xs.push_back(m);
  if (off_line) pp.solo_peak = static_cast<double>(p.peak);
  else pp.line_xs.push_back(m), pp.peaks.push_back(static_cast<double>(p.peak));
  pp.times.push_back(p.micro_s);
  pp.updates.push_back(p.update_s);
  if (row.measured_peak <= probe_limit(s)) pp.largest_fit = std::max(pp.largest_fit, static_cast<int>(k));
  else if (!off_line) pp.bound = std::min(pp.bound, k);
}

/// Probes the pair's micro-batches in the order of Note [Probe order] on `model`, built for the
/// pair; the first one only once the pair is judged not slow (Note [Slow candidates]).
void probe_pair(Planner& s, PlanFit& fit, PairProbes& pp, const std::shared_ptr<models::Model>& model) {
  for (int i = next_probe(s, pp); i >= 0 && !fit.slow; i = next_probe(s, pp)) {
    const auto k = static_cast<size_t>(i);
    PlanRow& row = s.plan.rows[pp.first_row + k];
    const bool off_line = pp.solo && k == pp.last;
    try {
      if (k == 0 && judged_slow(s, fit, *model)) break;
      const Probe p = run_probe(s.cfg, s.ctx, model, s.train, fit.precision, fit.policy, s.micros[k],
                                row.accumulation, s.world_size, s.opt.measure_steps, s.delay);
      record_probe(s, pp, k, p);
    } catch (const c10::OutOfMemoryError&) {
      row.oom = true;
      if (!off_line) pp.bound = std::min(pp.bound, k);
    }
  }
}

/// Builds the pair's model (seeded, on the device, in training mode) under its checkpoint policy.
std::shared_ptr<models::Model> build_pair_model(const Planner& s, const std::string& policy) {
  torch::manual_seed(static_cast<uint64_t>(s.cfg.data.seed));
  std::shared_ptr<models::Model> model = models::build_model(s.cfg.model);
  model->to(s.device);
  model->train();
  models::apply_checkpoint_policy(*model, models::CheckpointPolicy::parse(policy));
  return model;
}

/// The pair's rows that were not probed: all of them when the pair was slow, else those below a
/// micro-batch measured to fit.
void mark_unprobed_rows(Planner& s, const PlanFit& fit, const PairProbes& pp) {
  for (size_t k = 0; k < s.micros.size(); ++k) {
    auto& row = s.plan.rows[pp.first_row + k];
    if (fit.slow) row.slow = true;
    // Below a micro-batch measured to fit: dominated by it (Note [Probe order]).
    else if (!row.probed && !row.oom && !row.attention_pruned && static_cast<int>(k) < pp.largest_fit)
      row.skipped = true;
  }
}

/// Fits the pair's memory and time lines to its probes and predicts every row of the pair with
/// them; does nothing when no probe completed.
void fit_pair(Planner& s, PlanFit& fit, const PairProbes& pp) {
  Plan& plan = s.plan;
  fit.points = static_cast<int>(pp.xs.size());
  if (pp.xs.empty()) {
    // No probe: for the candidates pruned by it, the floor is all that is known (Note [Attention floor]).
    for (size_t i = pp.first_row; i < plan.rows.size(); ++i)
      if (plan.rows[i].attention_pruned) plan.rows[i].predicted_peak = plan.rows[i].floor_peak;
    return;
  }
  // A lone accumulation-1 probe (a batch of 1) still gives the line its one point.
  const auto [a, b] = pp.line_xs.empty() ? fit_line(pp.xs, {pp.solo_peak}, static_cast<double>(plan.fixed_minimum))
                                         : fit_line(pp.line_xs, pp.peaks, static_cast<double>(plan.fixed_minimum));
  fit.fixed_bytes = a + static_cast<double>(s.comm_bytes);
  fit.per_sample_bytes = b;
  const auto [ta, tb] = fit_line(pp.xs, pp.times, 0.0);
  fit.micro_fixed_s = std::max(0.0, ta);
  fit.micro_per_sample_s = tb;
  double u = 0;
  for (double v : pp.updates) u += v;
  fit.update_s = u / static_cast<double>(pp.updates.size());
  for (size_t i = pp.first_row; i < plan.rows.size(); ++i) {
    auto& row = plan.rows[i];
    const double m = static_cast<double>(row.micro_batch);
    row.predicted_peak = static_cast<int64_t>(std::ceil(fit.fixed_bytes + fit.per_sample_bytes * m));
    // Never below the floor (Note [Attention floor]): it matters where the line was fitted
    // on small micro-batches whose per-sample slope the attention term outgrows.
    row.predicted_peak = std::max(row.predicted_peak, row.floor_peak);
    // Off the line: its own measurement is its prediction (Note [Planner probe]).
    if (pp.solo && i == pp.first_row + pp.last && row.probed) row.predicted_peak = row.measured_peak;
    const double micro_s = std::max(1e-9, fit.micro_fixed_s + fit.micro_per_sample_s * m);
    row.predicted_sps = static_cast<double>(s.cfg.train.global_batch) /
                        (static_cast<double>(row.accumulation) * micro_s + fit.update_s);
    // Under the most saving model-state option; assign_states() settles the option.
    row.fits = row.probed && row.measured_peak <= probe_limit(s) && row.predicted_peak <= probe_limit(s);
  }
}

// Note [Recomputation is dominated]: at the same precision and micro-batch, a checkpointing
// policy runs the forward of `none` plus some of it again in the backward, and saves only
// memory. So once `none` fits at the whole per-rank batch (accumulation 1, the fastest
// micro-batch under the time model), every candidate of a later policy of that precision is
// dominated by it and is not probed: its rows are `skipped`, its fit `dominated`. Where it
// applies it removes two of three pairs' probes (GPT-12L seq 512 under 4 GiB: 12 candidates,
// 4 probes instead of 12); where `none` does not fit the whole batch, every policy is probed.

// Note [Attention floor]: the model kind's analytic attention term (models/attention_memory.h,
// Note [Attention memory term] in models/src/attention_memory.cpp) is the bytes of [B,H,T,T]
// tensors its attention cores keep for backward, per sample: 0 under a fused SDPA kernel,
// layers x heads x T^2 x the bytes the plain core keeps per score under `none`; one layer's
// core briefly adds two more such tensors (floor_bytes_per_sample = term + that transient).
// At that moment the step also holds the fixed part (parameters, the gradients of the
// earlier micro-batch, the optimizer state, the gradient buckets), so
//     floor(m) = fixed part + (term + transient) x m
// is a lower bound on a candidate's peak; for the one-rank candidate without accumulation,
// whose gradients are freed before its forward (Note [Planner probe]), the fixed part less
// the gradients. A candidate whose floor is over the limit is not probed (`attention_pruned`;
// the larger micro-batches of the line with it), and when that is every candidate of a pair,
// its model is not even built: at seq 2048 a probe of a plain-attention GPT that cannot fit
// is the most expensive probe there is, and its out-of-memory error comes only after most
// of a forward. Every prediction is at least the floor (before the first probe the floor is
// the only prediction); a probe measuring above its prediction raises the line, never the
// floor. Rows record the term and the floor (plan.json `attention_bytes_per_sample`,
// `floor_peak_bytes`).

/// The pair's rows' attention term and floor (Note [Attention floor]).
void set_floors(const Planner& s, const PairProbes& pp, const models::AttentionMemory& am) {
  for (size_t k = 0; k < s.micros.size(); ++k) {
    PlanRow& row = s.plan.rows[pp.first_row + k];
    row.attention_bytes_per_sample = am.bytes_per_sample;
    if (am.floor_bytes_per_sample <= 0) continue;
    const int64_t fixed = s.plan.fixed_minimum - (pp.solo && k == pp.last ? s.grad_bytes : 0);
    row.floor_peak = fixed + am.floor_bytes_per_sample * s.micros[k];
  }
}

/// Marks the pair's rows whose floor is over the limit as pruned (the line's bound moves below
/// them); true when every row is.
bool prune_by_attention(const Planner& s, PairProbes& pp) {
  bool all = true;
  for (size_t k = 0; k < s.micros.size(); ++k) {
    PlanRow& row = s.plan.rows[pp.first_row + k];
    if (row.floor_peak > probe_limit(s)) {
      row.attention_pruned = true;
      if (!(pp.solo && k == pp.last)) pp.bound = std::min(pp.bound, k);
    } else {
      all = false;
    }
  }
  return all;
}

// Note [Selective under a fused kernel]: `selective` recomputes the attention core only where
// it materialises the [B,H,T,T] probabilities; under a fused SDPA kernel the core never runs
// through its recompute region (Note [Selective recompute under SDPA] in
// models/src/transformer.cpp), so a step under `selective` is the step under `none`: the same
// graph, the same peak, the same time (measured: AttentionMemory.SdpaDropsTheProbabilitiesAnd
// SelectiveKeepsNoneOfItsOwn). Its pair is not probed: its rows are none's predictions,
// `same_as` "none", never chosen (none's rows are).

/// The selective pair as a copy of the same precision's none (Note [Selective under a fused
/// kernel]); false when that none was not planned before it (then selective is probed).
bool copy_none(Planner& s, PlanFit& fit) {
  Plan& plan = s.plan;
  const PlanFit* none = nullptr;
  for (const auto& f : plan.fits)
    if (f.precision == fit.precision && f.policy == "none") none = &f;
  if (none == nullptr) return false;
  PlanFit copy = *none;
  copy.policy = fit.policy;
  copy.points = 0;
  copy.warmup_forward_s = -1;
  copy.same_as = "none";
  std::vector<PlanRow> rows;
  for (const auto& r : plan.rows) {
    if (r.precision != fit.precision || r.policy != "none") continue;
    PlanRow row = make_row(fit.precision, fit.policy, r.micro_batch, s.per_rank);
    row.predicted_peak = r.predicted_peak;
    row.predicted_sps = r.predicted_sps;
    row.attention_bytes_per_sample = r.attention_bytes_per_sample;
    row.floor_peak = r.floor_peak;
    row.same_as = "none";
    rows.push_back(row);
  }
  plan.rows.insert(plan.rows.end(), rows.begin(), rows.end());
  plan.fits.push_back(copy);
  return true;
}

/// One (precision, policy): its rows (one per micro-batch) and its fit, appended to the plan;
/// probed, or listed as slow or dominated without a probe.
void plan_pair(Planner& s, const std::string& precision, const std::string& policy) {
  Plan& plan = s.plan;
  PlanFit fit;
  fit.precision = precision;
  fit.policy = policy;
  const models::AttentionMemory& am = s.attention.at(precision + "/" + policy);
  fit.attention_core = am.core;
  fit.attention_bytes_per_sample = am.bytes_per_sample;
  PairProbes pp = start_pair(s);
  // Not probed: a later policy of a slow precision recomputes more, so at micro-batch 1 it
  // is slower still (Note [Slow candidates]); one of a precision whose `none` fits the whole
  // batch is dominated (Note [Recomputation is dominated]).
  fit.slow = s.slow_precisions.count(precision) > 0;
  fit.dominated = !fit.slow && policy != "none" && s.none_fits_whole.count(precision) > 0;
  if (fit.slow || fit.dominated) {
    for (const int64_t m : s.micros) {
      PlanRow row = make_row(precision, policy, m, s.per_rank);
      row.slow = fit.slow;
      row.skipped = fit.dominated;
      plan.rows.push_back(row);
    }
    set_floors(s, pp, am);
    plan.fits.push_back(fit);
    return;
  }
  if (policy == "selective" && am.selective_is_none && copy_none(s, fit)) return;
  for (const int64_t m : s.micros) plan.rows.push_back(make_row(precision, policy, m, s.per_rank));
  set_floors(s, pp, am);
  if (prune_by_attention(s, pp)) {
    // Every candidate of the pair is over the limit by its attention term alone: no model, no probe.
    fit_pair(s, fit, pp);
    plan.fits.push_back(fit);
    return;
  }
  try {
    const std::shared_ptr<models::Model> model = build_pair_model(s, policy);
    probe_pair(s, fit, pp, model);
  } catch (const c10::OutOfMemoryError&) {
    // The model and its optimizer state alone did not fit: every row of this pair is out.
    for (size_t k = 0; k < s.micros.size(); ++k)
      if (!plan.rows[pp.first_row + k].probed && !plan.rows[pp.first_row + k].attention_pruned)
        plan.rows[pp.first_row + k].oom = true;
  }
  mark_unprobed_rows(s, fit, pp);
  fit_pair(s, fit, pp);
  if (policy == "none" && plan.rows[pp.first_row + s.micros.size() - 1].fits) s.none_fits_whole.insert(precision);
  plan.fits.push_back(fit);
}

/// No candidate fits: a ConfigError with the smallest measured peak and the budget it needs.
[[noreturn]] void throw_no_fit(const Planner& s, const PlanOptions& opt) {
  const Plan& plan = s.plan;
  int64_t smallest = -1, smallest_floor = -1;
  const PlanRow* floor_row = nullptr;
  bool any_oom = false;
  for (const auto& r : plan.rows) {
    if (r.probed && (smallest < 0 || r.measured_peak < smallest)) smallest = r.measured_peak;
    any_oom |= r.oom;
    if (r.attention_pruned && (smallest_floor < 0 || r.floor_peak < smallest_floor)) {
      smallest_floor = r.floor_peak;
      floor_row = &r;
    }
  }
  if (smallest <= 0 && floor_row != nullptr) {
    // Nothing measured: the attention term alone put the candidates that were not out of
    // memory over the limit (Note [Attention floor]).
    const int64_t need = any_oom ? std::min(smallest_floor, opt.budget + 1) : smallest_floor;
    const auto at_least = static_cast<int64_t>(std::ceil(static_cast<double>(need) / (1.0 - opt.margin)));
    const auto& am = s.attention.at(floor_row->precision + "/" + floor_row->policy);
    throw ConfigError("memory.budget = " + bytes_text(opt.budget) + ": no configuration fits with the " +
                      fmt(100 * opt.margin, "%.0f") + "% margin: the attention cores' [B,H,T,T] tensors alone put " +
                      (any_oom ? "the candidates that did not run out of memory" : "every candidate") +
                      " over the limit (" + floor_row->precision + "/" + floor_row->policy + " at micro-batch " +
                      std::to_string(floor_row->micro_batch) + " needs at least " + bytes_text(smallest_floor) +
                      ": the fixed part + " + format_bytes(am.floor_bytes_per_sample) +
                      " a sample of [B,H,T,T] tensors, " + models::describe(am) +
                      " and two of one layer's for a moment); use model.attention = \"sdpa\" with model.dropout = 0 (a fused kernel keeps none of "
                      "them), a shorter model.seq_len, or give --memory-budget at least " +
                      std::to_string(at_least) + " bytes");
  }
  // Every probe out of memory: the smallest candidate needs more than the whole budget.
  const int64_t need = smallest > 0 ? smallest : opt.budget + 1;
  const auto at_least = static_cast<int64_t>(std::ceil(static_cast<double>(need) / (1.0 - opt.margin)));
  throw ConfigError("memory.budget = " + bytes_text(opt.budget) + ": no configuration fits with the " +
                    fmt(100 * opt.margin, "%.0f") + "% margin (" +
                    (smallest > 0 ? "the smallest measured peak is " + bytes_text(smallest)
                                  : std::string("every probe, micro-batch 1 included, ran out of memory")) +
                    "); give --memory-budget at least " + std::to_string(at_least) +
                    " bytes, or use a smaller model or sequence");
}

/// The choice: the highest predicted samples/s among the candidates that fit.
void choose(const Planner& s, const PlanOptions& opt) {
  Plan& plan = s.plan;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const auto& r = plan.rows[i];
    if (r.fits && (plan.chosen < 0 || r.predicted_sps > plan.rows[static_cast<size_t>(plan.chosen)].predicted_sps))
      plan.chosen = static_cast<int>(i);
  }
  if (plan.chosen < 0) throw_no_fit(s, opt);
}

}  // namespace

Plan make_plan(const Config& cfg, const RuntimeContext& ctx, int world_size, const PlanOptions& opt) {
  const int64_t per_rank = checked_per_rank_batch(cfg.train, world_size, opt);
  const torch::Device device = ctx.on_cuda() ? torch::Device(torch::kCUDA, ctx.device_index) : torch::Device(torch::kCPU);
  MemoryMeter meter(ctx.device_index);
  Plan plan = empty_plan(opt, world_size, cfg.train.global_batch, meter);
  const std::vector<std::string> precisions = candidate_precisions(opt, device);
  std::vector<int64_t> micros = candidate_micro_batches(per_rank);

  // The components' checks run before any data is read (the recompute policy is the planner's to pick).
  auto data = data::make_datasets(cfg.data, models::model_contract(cfg.model));
  const std::vector<int64_t> numels = parameter_counts(cfg);
  const int64_t param_bytes = fp32_bytes(numels);
  const int64_t comm_bytes = world_size > 1 ? param_bytes : 0;  // the gradient buckets' flat buffers
  plan.states = candidate_states(cfg, opt, world_size);
  plan.state_savings = state_savings(cfg, plan.states, numels, world_size);
  const auto most = std::max_element(plan.state_savings.begin(), plan.state_savings.end());
  const int64_t slack = *most;
  const std::string saver = plan.states[static_cast<size_t>(most - plan.state_savings.begin())];
  plan.fixed_minimum = checked_fixed_minimum(cfg.train, meter, param_bytes, comm_bytes, opt.budget, slack, saver);
  bool any_int8 = false;
  for (const auto& st : plan.states) any_int8 |= st.find("int8") != std::string::npos;
  const double int8_factor = any_int8 ? int8_update_factor(device) : 1.0;

  Planner planner{cfg, ctx, opt, world_size, device, per_rank, std::move(micros), data.train, comm_bytes,
                  param_bytes, probe_delay_from_env(), plan, {}, slack};
  // The analytic attention terms (Note [Attention floor]), before the budget is in force (the
  // SDPA kernel query allocates one [1,H,T,D/H] tensor).
  for (const auto& precision : precisions)
    for (const auto& policy : opt.policies) {
      const c10::ScalarType dtype =
          precision == "bf16" ? c10::kBFloat16 : (precision == "fp16" ? c10::kHalf : c10::kFloat);
      planner.attention[precision + "/" + policy] =
          models::attention_memory(cfg.model, device, dtype, models::CheckpointPolicy::parse(policy));
    }
  // The probes hold no gradient buckets: under mpirun their buffers come off the budget.
  // The model-state options' savings come on top (Note [Model state in the plan]).
  BudgetScope scope(meter, opt.budget - comm_bytes + slack);
  for (const auto& precision : precisions)
    for (const auto& policy : opt.policies) plan_pair(planner, precision, policy);
  assign_states(plan, plan.fits, int8_factor);
  choose(planner, opt);
  return plan;
}

Plan agree_on_plan(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm, const PlanOptions& opt) {
  if (comm.size() == 1) return make_plan(cfg, ctx, 1, opt);
  // Note [--auto across ranks]: every rank probing its own device could time its way to
  // another choice (the samples/s of close candidates differ by noise), and the ranks must
  // run one layout. Rank 0 plans; the others wait in the broadcast (setup deadline).
  static const std::vector<std::string> precisions = {"fp32", "bf16", "fp16"};
  static const std::vector<std::string> policies = {"none", "selective", "full"};
  static const std::vector<std::string> shards = {"none", "optimizer", "gradients"};
  static const std::vector<std::string> states = {"fp32", "int8"};
  auto index_of = [](const std::vector<std::string>& v, const std::string& s) {
    return static_cast<double>(std::find(v.begin(), v.end(), s) - v.begin());
  };
  Plan plan;
  std::string error;
  auto msg = torch::zeros({7}, torch::kDouble);  // ok, precision, policy, micro_batch, accumulation, shard, state
  if (comm.rank() == 0) {
    try {
      plan = make_plan(cfg, ctx, comm.size(), opt);
      const auto& c = plan.choice();
      msg = torch::tensor({1.0, index_of(precisions, c.precision), index_of(policies, c.policy),
                           static_cast<double>(c.micro_batch), static_cast<double>(c.accumulation),
                           index_of(shards, c.shard), index_of(states, c.optimizer_state)},
                          torch::kDouble);
    } catch (const ConfigError& e) {
      error = e.what();
    }
  }
  comm.set_timeout(cfg.comm.startup_timeout_s);
  comm.broadcast(msg, 0);
  if (msg[0].item<double>() == 0)
    throw ConfigError(comm.rank() == 0 ? error
                                       : "memory.budget = " + cfg.memory.budget +
                                             ": refused by the planner on rank 0 (its message says why and what "
                                             "budget it needs)");
  if (comm.rank() == 0) return plan;
  plan.budget = opt.budget;
  plan.margin = opt.margin;
  plan.limit = static_cast<int64_t>(static_cast<double>(opt.budget) * (1.0 - opt.margin));
  plan.world_size = comm.size();
  plan.global_batch = cfg.train.global_batch;
  PlanRow row;
  row.precision = precisions.at(static_cast<size_t>(msg[1].item<double>()));
  row.policy = policies.at(static_cast<size_t>(msg[2].item<double>()));
  row.micro_batch = static_cast<int64_t>(msg[3].item<double>());
  row.accumulation = static_cast<int64_t>(msg[4].item<double>());
  row.shard = shards.at(static_cast<size_t>(msg[5].item<double>()));
  row.optimizer_state = states.at(static_cast<size_t>(msg[6].item<double>()));
  row.fits = true;
  plan.rows.push_back(row);
  plan.chosen = 0;
  return plan;
}

std::string plan_table(const Plan& plan) {
  std::ostringstream o;
  o << "memory plan for " << plan.device << ": budget " << format_bytes(plan.budget) << ", limit "
    << format_bytes(plan.limit) << " (" << fmt(100 * plan.margin, "%.0f") << "% margin), global batch "
    << plan.global_batch << " on " << plan.world_size << " rank(s)\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-5s %-9s %6s %6s %-14s  %12s %12s  %10s %10s  %s\n", "prec", "ckpt", "micro",
                "accum", "state", "pred peak", "meas peak", "pred sps", "meas sps", "");
  o << line;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const auto& r = plan.rows[i];
    // A prediction without any probe of the pair is the attention floor: ">=".
    const std::string pred = r.predicted_peak < 0 ? "-"
                             : (r.attention_pruned && r.predicted_peak == r.floor_peak ? ">=" : "") +
                                   format_bytes(r.predicted_peak);
    const std::string meas =
        r.probed ? format_bytes(r.measured_peak)
                 : (r.oom ? "OOM"
                          : (r.slow ? "slow"
                                    : (r.skipped ? "skipped"
                                                 : (!r.same_as.empty() ? "= " + r.same_as
                                                                       : (r.attention_pruned ? "pruned:attn" : "pruned")))));
    const std::string psps = r.predicted_sps > 0 ? fmt(r.predicted_sps, "%.1f") : "-";
    const std::string msps = r.measured_sps > 0 ? fmt(r.measured_sps, "%.1f") : "-";
    const std::string mark = static_cast<int>(i) == plan.chosen ? "<- chosen" : (r.fits ? "fits" : "");
    const std::string state = r.shard + "/" + r.optimizer_state;
    std::snprintf(line, sizeof line, "  %-5s %-9s %6lld %6lld %-14s  %12s %12s  %10s %10s  %s\n", r.precision.c_str(),
                  r.policy.c_str(), static_cast<long long>(r.micro_batch), static_cast<long long>(r.accumulation),
                  state.c_str(), pred.c_str(), meas.c_str(), psps.c_str(), msps.c_str(), mark.c_str());
    o << line;
  }
  o << "fits (peak = fixed + per_sample x micro_batch):\n";
  for (const auto& f : plan.fits) {
    if (f.slow) {
      o << "  " << f.precision << " " << f.policy << ": slow"
        << (f.warmup_forward_s > 0 ? " (warm-up forward " + fmt(f.warmup_forward_s, "%.3g") + " s/sample)"
                                   : std::string(" (its precision was slow with an earlier policy)"))
        << ", not probed\n";
      continue;
    }
    if (f.dominated) {
      o << "  " << f.precision << " " << f.policy << ": dominated, not probed (" << f.precision
        << " none fits at the whole batch; recomputation only adds time)\n";
      continue;
    }
    if (!f.same_as.empty()) {
      o << "  " << f.precision << " " << f.policy << ": same as " << f.same_as << ", not probed (" << f.attention_core
        << " keeps no [B,H,T,T] tensors for " << f.policy << " to drop)\n";
      continue;
    }
    const std::string attention =
        f.attention_bytes_per_sample > 0
            ? "; attention " + format_bytes(f.attention_bytes_per_sample) + "/sample (" + f.attention_core + ")"
            : (f.attention_core.empty() ? "" : "; attention " + f.attention_core + ": no [B,H,T,T] tensors");
    if (f.points == 0) {
      o << "  " << f.precision << " " << f.policy << ": no probe fitted" << attention << "\n";
      continue;
    }
    o << "  " << f.precision << " " << f.policy << ": fixed " << format_bytes(static_cast<int64_t>(f.fixed_bytes))
      << " + " << format_bytes(static_cast<int64_t>(f.per_sample_bytes)) << "/sample (" << f.points << " probes)"
      << attention << "\n";
  }
  if (plan.chosen >= 0) {
    std::string sets;
    for (const auto& s : plan_overrides(plan)) sets += " --set " + s;
    o << "chosen:" << sets << "\n";
  }
  return o.str();
}

std::vector<std::string> plan_overrides(const Plan& plan) {
  const auto& c = plan.choice();
  return {"precision.mode=" + c.precision, "memory.activation_checkpoint=" + c.policy,
          "train.micro_batch=" + std::to_string(c.micro_batch), "train.global_batch=" + std::to_string(plan.global_batch),
          "memory.shard=" + c.shard, "memory.optimizer_state=" + c.optimizer_state,
          "memory.budget=" + std::to_string(plan.budget)};
}

MetricFields plan_event(const Plan& plan) {
  const auto& c = plan.choice();
  int64_t probes = 0;
  for (const auto& r : plan.rows) probes += r.probed ? 1 : 0;
  return {{"budget_bytes", plan.budget},
          {"margin", plan.margin},
          {"limit_bytes", plan.limit},
          {"precision", c.precision},
          {"activation_checkpoint", c.policy},
          {"micro_batch", c.micro_batch},
          {"accumulation", c.accumulation},
          {"shard", c.shard},
          {"optimizer_state", c.optimizer_state},
          {"global_batch", plan.global_batch},
          {"predicted_peak_bytes", c.predicted_peak},
          {"measured_peak_bytes", c.measured_peak},
          {"predicted_samples_per_s", c.predicted_sps},
          {"measured_samples_per_s", c.measured_sps},
          {"candidates", static_cast<int64_t>(plan.rows.size())},
          {"probes", probes}};
}

std::string plan_to_json(const Plan& plan) {
  auto row_json = [](const PlanRow& r) {
    return nlohmann::json{{"precision", r.precision},         {"activation_checkpoint", r.policy},
                          {"micro_batch", r.micro_batch},     {"accumulation", r.accumulation},
                          {"shard", r.shard},                 {"optimizer_state", r.optimizer_state},
                          {"probed", r.probed},               {"oom", r.oom},
                          {"slow", r.slow},
                          {"skipped", r.skipped},
                          {"measured_peak_bytes", r.measured_peak}, {"predicted_peak_bytes", r.predicted_peak},
                          {"measured_samples_per_s", r.measured_sps}, {"predicted_samples_per_s", r.predicted_sps},
                          {"fits", r.fits},
                          {"attention_bytes_per_sample", r.attention_bytes_per_sample},
                          {"floor_peak_bytes", r.floor_peak},
                          {"attention_pruned", r.attention_pruned},
                          {"same_as", r.same_as.empty() ? nlohmann::json() : nlohmann::json(r.same_as)}};
  };
  nlohmann::json j;
  j["budget_bytes"] = plan.budget;
  j["margin"] = plan.margin;
  j["slow_factor"] = plan.slow_factor;
  j["limit_bytes"] = plan.limit;
  j["fixed_minimum_bytes"] = plan.fixed_minimum;
  j["states"] = plan.states;
  j["state_savings_bytes"] = plan.state_savings;
  j["world_size"] = plan.world_size;
  j["global_batch"] = plan.global_batch;
  j["device"] = plan.device;
  j["candidates"] = nlohmann::json::array();
  for (const auto& r : plan.rows) j["candidates"].push_back(row_json(r));
  j["fits"] = nlohmann::json::array();
  for (const auto& f : plan.fits)
    j["fits"].push_back({{"precision", f.precision},
                         {"activation_checkpoint", f.policy},
                         {"fixed_bytes", f.fixed_bytes},
                         {"per_sample_bytes", f.per_sample_bytes},
                         {"micro_fixed_s", f.micro_fixed_s},
                         {"micro_per_sample_s", f.micro_per_sample_s},
                         {"update_s", f.update_s},
                         {"points", f.points},
                         {"warmup_forward_s", f.warmup_forward_s},
                         {"slow", f.slow},
                         {"dominated", f.dominated},
                         {"attention_core", f.attention_core},
                         {"attention_bytes_per_sample", f.attention_bytes_per_sample},
                         {"same_as", f.same_as.empty() ? nlohmann::json() : nlohmann::json(f.same_as)}});
  if (plan.chosen >= 0) {
    j["chosen"] = row_json(plan.choice());
    j["set"] = plan_overrides(plan);
  }
  return j.dump(2);
}

}  // namespace lt::trainers
