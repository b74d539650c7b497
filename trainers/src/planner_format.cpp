// The planner's output formats: the table `leantrain plan` prints, plan.json, the --set
// overrides of the choice and the `plan` metrics event. Torch-free.
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "leantrain/runtime/memory_meter.h"
#include "planner_internal.h"

namespace lt::trainers {

using planner_detail::fmt;

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
  return {"precision.mode=" + c.precision, "memory.recompute=" + c.policy,
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
          {"recompute", c.policy},
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
    return nlohmann::json{{"precision", r.precision},         {"recompute", r.policy},
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
                         {"recompute", f.policy},
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
