// The planner's search: every (precision, policy) probed in the order of its notes, the
// memory and time lines fitted, the fastest candidate that fits chosen (docs/PLANNER.md). The
// probe itself, the fixed part and the model-state options are planner_probe.cpp, the output
// formats planner_format.cpp, the agreement across ranks planner_agree.cpp.
#include "leantrain/trainers/planner.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "leantrain/data/dataset.h"
#include "leantrain/data/registry.h"
#include "leantrain/models/attention_memory.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/optim/optimizer.h"
#include "leantrain/runtime/device.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/precision.h"
#include "leantrain/trainers/precision.h"
#include "planner_internal.h"

namespace lt::trainers {
namespace {

using namespace planner_detail;

/// Lifts the budget when the planner is done (its probes ran under it as a hard limit).
struct BudgetScope {
  MemoryMeter& meter;
  BudgetScope(MemoryMeter& m, int64_t bytes) : meter(m) { meter.set_budget(bytes); }
  ~BudgetScope() { meter.set_budget(0); }
};

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
      check_precision_supported(Precision::kBf16, device);
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

/// Builds the pair's model (seeded, on the device, in training mode) under its recompute policy.
std::shared_ptr<models::Model> build_pair_model(const Planner& s, const std::string& policy) {
  torch::manual_seed(static_cast<uint64_t>(s.cfg.data.seed));
  std::shared_ptr<models::Model> model = models::build_model(s.cfg.model);
  model->to(s.device);
  model->train();
  models::apply_recompute_policy(*model, models::RecomputePolicy::parse(policy));
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
  const torch::Device device = device_of(ctx);
  MemoryMeter meter(ctx.device_index);
  Plan plan = empty_plan(opt, world_size, cfg.train.global_batch, meter);
  const std::vector<std::string> precisions = candidate_precisions(opt, device);
  std::vector<int64_t> micros = candidate_micro_batches(per_rank);

  // The components' checks run before any data is read (the recompute policy is the planner's to pick).
  auto data = data::make_datasets(cfg.data, models::model_contract(cfg.model));
  const std::vector<int64_t> numels = parameter_counts(cfg);
  const int64_t param_bytes = optim::fp32_bytes(numels);
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
      planner.attention[precision + "/" + policy] = models::attention_memory(
          cfg.model, device, compute_dtype(parse_precision(precision)), models::RecomputePolicy::parse(policy));
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

}  // namespace lt::trainers
