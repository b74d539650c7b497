// `leantrain plan` and `train --auto` end to end (docs/PLANNER.md): the planner measures
// precision x activation recompute x micro-batch under the budget, and its choice, used
// for a real run, never exceeds the budget. Budgets come from peaks the test measures.
#include <chrono>
#include <map>

#include "cli_fixture.h"

namespace {

class Planner : public Cli {
 protected:
  std::string config(int steps) { return tiny_gpt_config(0.0, steps); }
  // The largest step peak of a run of the tiny GPT with micro-batch 8 and no budget.
  int64_t peak_of_micro8() {
    auto r = run("train --config " + config(3) + " --out " + (dir_ / "peak").string());
    EXPECT_EQ(r.code, 0) << r.err;
    int64_t peak = 0;
    for (const auto& s : events(dir_ / "peak", "step")) peak = std::max(peak, s["peak_mem_bytes"].get<int64_t>());
    return peak;
  }
  // The fixed part the planner refuses a budget below (parsed from its message).
  int64_t fixed_minimum() {
    auto r = run("plan --config " + config(3) + " --memory-budget 100KiB --out " + (dir_ / "low").string());
    EXPECT_EQ(r.code, 2) << r.err;
    const auto at = r.err.find("at least ");
    return at == std::string::npos ? -1 : std::stoll(r.err.substr(at + 9));
  }
  void expect_steps_within(const fs::path& run_dir, int64_t budget, size_t steps) {
    const auto s = events(run_dir, "step");
    EXPECT_EQ(s.size(), steps);
    for (const auto& e : s) EXPECT_LE(e["peak_mem_bytes"].get<int64_t>(), budget) << "step " << e["step"];
    EXPECT_TRUE(events(run_dir, "oom_backoff").empty());
  }
};

TEST_F(Planner, BudgetBelowTheFixedPartIsRefusedWithTheMinimum) {
  expect_config_error("plan --config " + config(3) + " --memory-budget 100KiB --out " + (dir_ / "p").string(),
                      "memory.budget = 100.00 KiB (102400 bytes) is below the fixed part of every candidate");
  const int64_t minimum = fixed_minimum();
  EXPECT_GE(minimum, 4 * 114176);  // parameters, gradients, two AdamW moments of 28544 floats
  EXPECT_LT(minimum, 4 * 114176 + 100000);
  EXPECT_FALSE(fs::exists(dir_ / "p" / "plan.json"));
}

TEST_F(Planner, NoCandidateFittingIsAConfigErrorWithTheBudgetItNeeds) {
  const int64_t minimum = fixed_minimum();
  ASSERT_GT(minimum, 0);
  auto r = run("plan --config " + config(3) + " --memory-budget " + std::to_string(minimum + 4096) + " --out " +
               (dir_ / "p").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("no configuration fits with the 10% margin"), std::string::npos) << r.err;
  const auto at = r.err.find("give --memory-budget at least ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_GT(std::stoll(r.err.substr(at + 30)), minimum + 4096);

  // train --auto under mpirun: rank 0's planner decides (for 2 ranks the gradient buckets
  // add to the fixed part), and every rank stops with exit 2.
  auto m = run_cmd(mpirun(2) + LEANTRAIN_BINARY + " train --config " + config(3) + " --auto --memory-budget " +
                   std::to_string(minimum + 4096) + " --out " + (dir_ / "m").string());
  EXPECT_EQ(m.code, 2) << m.err;
  EXPECT_NE(m.err.find("give --memory-budget at least "), std::string::npos) << m.err;
  EXPECT_NE(m.err.find("refused by the planner on rank 0"), std::string::npos) << m.err;
}

// The test: the chosen plan, used for a 30-step run, never exceeds the budget.
TEST_F(Planner, ChosenPlanKeepsA30StepRunUnderTheBudget) {
  const int64_t budget = peak_of_micro8() * 4 / 5;  // micro-batch 8 without recompute does not fit
  const auto out = dir_ / "plan";
  auto r = run("plan --config " + config(30) + " --memory-budget " + std::to_string(budget) +
               " --global-batch 32 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("<- chosen"), std::string::npos) << r.out;
  const auto plan = nlohmann::json::parse(slurp(out / "plan.json"));
  EXPECT_EQ(plan["budget_bytes"], budget);
  EXPECT_EQ(plan["global_batch"], 32);
  const int64_t limit = plan["limit_bytes"].get<int64_t>();
  EXPECT_EQ(limit, static_cast<int64_t>(static_cast<double>(budget) * 0.9));
  const auto& c = plan["chosen"];
  EXPECT_LE(c["measured_peak_bytes"].get<int64_t>(), limit);
  EXPECT_LE(c["predicted_peak_bytes"].get<int64_t>(), limit);
  EXPECT_EQ(c["micro_batch"].get<int64_t>() * c["accumulation"].get<int64_t>(), 32);
  // Every candidate was listed; the big micro-batches were pruned or ran out of memory, and
  // the fastest prediction among those that fit was chosen.
  int pruned_or_oom = 0;
  double best = 0;
  for (const auto& row : plan["candidates"]) {
    if (!row["probed"].get<bool>()) ++pruned_or_oom;
    if (row["fits"].get<bool>()) best = std::max(best, row["predicted_samples_per_s"].get<double>());
    if (row["probed"].get<bool>()) EXPECT_LE(row["measured_peak_bytes"].get<int64_t>(), budget);
  }
  EXPECT_GT(pruned_or_oom, 0);
  EXPECT_EQ(c["predicted_samples_per_s"].get<double>(), best);
  // Note [Probe order]: micro-batch 1, then the largest predicted to fit; the micro-batches
  // between are skipped (predicted only), each below a larger probed one that fits and is
  // predicted faster. Six micro-batches (1..32) a pair, at most four probes.
  std::map<std::string, std::vector<nlohmann::json>> pairs;
  for (const auto& row : plan["candidates"])
    pairs[row["precision"].get<std::string>() + "/" + row["recompute"].get<std::string>()].push_back(row);
  int skipped = 0;
  for (const auto& [pair, rows] : pairs) {
    ASSERT_EQ(rows.size(), 6u) << pair;
    if (rows[0]["same_as"].is_string()) {
      // Note [Selective under a fused kernel]: the tiny GPT's SDPA runs the flash kernel, so
      // selective is none's step and is not probed.
      EXPECT_NE(pair.find("/selective"), std::string::npos) << pair;
      for (const auto& r : rows) EXPECT_FALSE(r["probed"].get<bool>()) << pair;
      continue;
    }
    int probes = 0;
    for (const auto& r : rows) probes += r["probed"].get<bool>() ? 1 : 0;
    EXPECT_GE(probes, 1) << pair;
    EXPECT_LE(probes, 4) << pair;
    EXPECT_TRUE(rows[0]["probed"].get<bool>()) << pair;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i]["skipped"].get<bool>()) continue;
      ++skipped;
      EXPECT_FALSE(rows[i]["probed"].get<bool>());
      EXPECT_FALSE(rows[i]["fits"].get<bool>());
      bool dominated = false;
      for (size_t j = i + 1; j < rows.size(); ++j)
        dominated |= rows[j]["fits"].get<bool>() && rows[j]["predicted_samples_per_s"].get<double>() >=
                                                        rows[i]["predicted_samples_per_s"].get<double>();
      EXPECT_TRUE(dominated) << pair << " micro-batch " << rows[i]["micro_batch"];
    }
  }
  EXPECT_GT(skipped, 0);
  const auto ev = events(out, "plan");
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0]["micro_batch"], c["micro_batch"]);
  EXPECT_EQ(ev[0]["precision"], c["precision"]);

  std::string sets;
  for (const auto& s : plan["set"]) sets += " --set " + s.get<std::string>();
  auto t = run("train --config " + config(30) + sets + " --out " + (dir_ / "run").string());
  ASSERT_EQ(t.code, 0) << t.err;
  expect_steps_within(dir_ / "run", budget, 30);
  for (const auto& s : events(dir_ / "run", "step")) EXPECT_EQ(s["micro_batch"], c["micro_batch"]);
}

// Note [Planner probe]: at one rank without accumulation the training step frees the
// gradients before its only forward; that candidate's probe measures that step's peak (below
// the worst-position line by up to the gradients), and when it fits every smaller
// micro-batch of its pair is skipped.
TEST_F(Planner, OneRankWithoutAccumulationIsProbedAsItTrains) {
  auto step_peak = [&](const std::string& name, int64_t global) {
    const auto out = dir_ / name;
    auto r = run("train --config " + config(3) + " --set train.global_batch=" + std::to_string(global) + " --out " +
                 out.string());
    EXPECT_EQ(r.code, 0) << r.err;
    int64_t peak = 0;
    for (const auto& s : events(out, "step")) peak = std::max(peak, s["peak_mem_bytes"].get<int64_t>());
    return peak;
  };
  const int64_t alone = step_peak("a1", 8);        // micro-batch 8, accumulation 1
  const int64_t accumulating = step_peak("a2", 16);  // micro-batch 8, accumulation 2
  ASSERT_LT(alone, accumulating);
  const auto out = dir_ / "plan";
  auto r = run("plan --config " + config(3) + " --memory-budget 1GiB --global-batch 8 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto plan = nlohmann::json::parse(slurp(out / "plan.json"));
  int rows = 0, dominated_rows = 0;
  for (const auto& row : plan["candidates"]) {
    if (row["precision"] != "fp32") continue;
    const std::string what = row["recompute"].get<std::string>() + " micro " + row["micro_batch"].dump();
    if (row["recompute"] != "none") {
      // Note [Recomputation is dominated]: none fits at the whole batch, so the recompute
      // policies of fp32 are not probed at all.
      ++dominated_rows;
      EXPECT_TRUE(row["skipped"].get<bool>()) << what;
      EXPECT_FALSE(row["probed"].get<bool>()) << what;
      EXPECT_FALSE(row["fits"].get<bool>()) << what;
      continue;
    }
    if (row["micro_batch"] == 8) {
      ++rows;
      ASSERT_TRUE(row["probed"].get<bool>()) << what;
      EXPECT_TRUE(row["fits"].get<bool>()) << what;
      EXPECT_EQ(row["predicted_peak_bytes"], row["measured_peak_bytes"]) << what;
      const auto probe = row["measured_peak_bytes"].get<int64_t>();
      EXPECT_NEAR(static_cast<double>(probe), static_cast<double>(alone), 0.05 * static_cast<double>(alone)) << what;
      EXPECT_LT(probe, accumulating) << what;
    } else if (row["micro_batch"] != 1) {
      EXPECT_TRUE(row["skipped"].get<bool>()) << what;
    }
  }
  EXPECT_EQ(rows, 1);
  EXPECT_EQ(dominated_rows, 8);  // selective and full x micro-batches 1, 2, 4, 8
  int dominated_fits = 0;  // of fp32 (bf16's none fits the whole batch too: the same holds there)
  for (const auto& f : plan["fits"]) {
    const bool expect = f["recompute"] != "none";
    EXPECT_EQ(f["dominated"].get<bool>(), expect) << f.dump();
    if (expect) EXPECT_EQ(f["points"].get<int>(), 0) << f.dump();
    if (f["precision"] == "fp32") dominated_fits += f["dominated"].get<bool>() ? 1 : 0;
  }
  EXPECT_EQ(dominated_fits, 2);
  EXPECT_NE(r.out.find("fp32 full: dominated, not probed (fp32 none fits at the whole batch"), std::string::npos)
      << r.out;
}

TEST_F(Planner, TrainAutoPlansThenTrainsWithTheChoiceUnderTheBudget) {
  const int64_t budget = peak_of_micro8() * 4 / 5;
  const auto out = dir_ / "run";
  auto r = run("train --config " + config(10) + " --auto --memory-budget " + std::to_string(budget) + " --out " +
               out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const auto plan = events(out, "plan");
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0]["budget_bytes"], budget);
  EXPECT_TRUE(fs::exists(out / "plan.json"));
  expect_steps_within(out, budget, 10);
  for (const auto& s : events(out, "step")) {
    EXPECT_EQ(s["micro_batch"], plan[0]["micro_batch"]);
    EXPECT_EQ(s["accumulation"], plan[0]["accumulation"]);
  }
  const auto cfg = nlohmann::json::parse(slurp(out / "config.json"));
  EXPECT_EQ(cfg["precision"]["mode"], plan[0]["precision"]);
  EXPECT_EQ(cfg["memory"]["recompute"], plan[0]["recompute"]);
}

// Under mpirun rank 0 plans for both ranks and broadcasts the choice: one table, one layout
// (per-rank batch 8 = micro x accumulation), every step under the budget.
TEST_F(Planner, TrainAutoUnderMpirunRunsRankZerosChoiceOnEveryRank) {
  const int64_t budget = peak_of_micro8() * 4 / 5;
  const auto out = dir_ / "run";
  auto r = run_cmd(mpirun(2) + LEANTRAIN_BINARY + " train --config " + config(6) + " --auto --memory-budget " +
                   std::to_string(budget) + " --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  size_t tables = 0;
  for (auto at = r.out.find("memory plan for"); at != std::string::npos; at = r.out.find("memory plan for", at + 1))
    ++tables;
  EXPECT_EQ(tables, 1u) << r.out;
  EXPECT_NE(r.out.find("global batch 16 on 2 rank(s)"), std::string::npos) << r.out;
  const auto plan = events(out, "plan");
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(plan[0]["micro_batch"].get<int64_t>() * plan[0]["accumulation"].get<int64_t>(), 8);
  expect_steps_within(out, budget, 6);
  for (const auto& s : events(out, "step")) EXPECT_EQ(s["micro_batch"], plan[0]["micro_batch"]);
}

TEST_F(Planner, PlanUnderMpirunPlansOnceForEveryRank) {
  const auto out = dir_ / "plan";
  auto r = run_cmd(mpirun(2) + LEANTRAIN_BINARY + " plan --config " + config(3) + " --memory-budget 1500000 --out " +
                   out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("memory plan for"), r.out.rfind("memory plan for")) << r.out;  // one table
  const auto plan = nlohmann::json::parse(slurp(out / "plan.json"));
  EXPECT_EQ(plan["world_size"], 2);
  EXPECT_EQ(plan["chosen"]["micro_batch"].get<int64_t>() * plan["chosen"]["accumulation"].get<int64_t>(), 8);
  // The gradient buckets' buffers (one fp32 copy of the 28544 parameters) are in every fit.
  for (const auto& row : plan["candidates"])
    if (row["probed"].get<bool>()) EXPECT_LE(row["measured_peak_bytes"].get<int64_t>(), 1500000);
  EXPECT_GE(plan["fixed_minimum_bytes"].get<int64_t>(), 5 * 114176);
}

// Note [Slow candidates]: a precision whose first warm-up forward is over 4x the fastest one
// and at least 0.5 s a sample (here bf16, slowed on purpose by the test-only delay of 0.6 s
// per sample, while the tiny GPT's fp32 forward takes about a millisecond) is not probed: its rows are `slow`, its later
// policies are skipped without a forward, and the choice is among the fp32 candidates.
TEST_F(Planner, ASlowPrecisionIsListedAsSlowAndNotProbed) {
  const auto out = dir_ / "plan";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = run_cmd("LEANTRAIN_PLANNER_DELAY=bf16:0.6 " + std::string(LEANTRAIN_BINARY) + " plan --config " +
                   config(3) + " --memory-budget 4MiB --out " + out.string());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(r.code, 0) << r.err;
  const auto plan = nlohmann::json::parse(slurp(out / "plan.json"));
  EXPECT_EQ(plan["slow_factor"], 4.0);
  double fp32_warmup = -1;
  int bf16_rows = 0;
  for (const auto& f : plan["fits"]) {
    if (f["precision"] == "fp32") {
      EXPECT_FALSE(f["slow"].get<bool>());
      // Not probed, no warm-up: Note [Recomputation is dominated], Note [Selective under a fused kernel].
      if (f["dominated"].get<bool>() || f["same_as"].is_string()) continue;
      EXPECT_GT(f["points"].get<int>(), 0);
      const double w = f["warmup_forward_s"].get<double>();
      if (fp32_warmup < 0 || w < fp32_warmup) fp32_warmup = w;
    }
  }
  ASSERT_GT(fp32_warmup, 0);
  for (const auto& f : plan["fits"]) {
    if (f["precision"] != "bf16") continue;
    EXPECT_TRUE(f["slow"].get<bool>()) << f.dump();
    EXPECT_EQ(f["points"].get<int>(), 0);
    if (f["recompute"] == "none") {
      EXPECT_GE(f["warmup_forward_s"].get<double>(), 0.6);  // the one forward that was run
      EXPECT_GT(f["warmup_forward_s"].get<double>(), 4 * fp32_warmup);
    } else {
      EXPECT_EQ(f["warmup_forward_s"].get<double>(), -1.0);  // skipped without a forward
    }
  }
  for (const auto& row : plan["candidates"]) {
    if (row["precision"] != "bf16") continue;
    ++bf16_rows;
    EXPECT_TRUE(row["slow"].get<bool>());
    EXPECT_FALSE(row["probed"].get<bool>());
    EXPECT_FALSE(row["fits"].get<bool>());
  }
  EXPECT_EQ(bf16_rows, 15);  // 3 policies x micro-batches 1, 2, 4, 8, 16
  EXPECT_EQ(plan["chosen"]["precision"], "fp32");
  EXPECT_NE(r.out.find("bf16 none: slow (warm-up forward"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("bf16 full: slow (its precision was slow with an earlier policy)"), std::string::npos) << r.out;
  // Probing bf16 like fp32 would sleep 0.6 s x 3 micro-steps x 31 samples x 3 policies = 167 s.
  EXPECT_LT(seconds, 20.0);

  // Without the delay bf16 is probed: its first forward is under 0.5 s (and its steps within
  // 4x of fp32's on any CPU).
  auto plain = run("plan --config " + config(3) + " --memory-budget 4MiB --out " + (dir_ / "plain").string());
  ASSERT_EQ(plain.code, 0) << plain.err;
  const auto p2 = nlohmann::json::parse(slurp(dir_ / "plain" / "plan.json"));
  for (const auto& f : p2["fits"]) EXPECT_FALSE(f["slow"].get<bool>()) << f.dump();

  // A malformed delay is a config error naming the variable.
  auto bad = run_cmd("LEANTRAIN_PLANNER_DELAY=bf16 " + std::string(LEANTRAIN_BINARY) + " plan --config " + config(3) +
                     " --memory-budget 4MiB --out " + (dir_ / "bad").string());
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("LEANTRAIN_PLANNER_DELAY"), std::string::npos) << bad.err;
}

// Note [Attention floor], Note [Selective under a fused kernel]: a GPT of 2 layers, d_model
// 64, 4 heads at seq 1024 (global batch 8: micro-batches 1, 2, 4, 8) under one budget, with
// each attention core. Plain attention keeps 2 x 4 x 1024^2 x 4 bytes a sample in fp32 (32
// MiB) and briefly 2 more of one layer's [H,T,T] (32 MiB): its `none` candidates are over the
// 57.6 MiB limit by that alone and are not probed; SDPA's flash kernel keeps none, fits a
// larger micro-batch, and its `selective` is `none`'s, listed and not probed.
TEST_F(Planner, TheAttentionTermPrunesPlainAndSdpaFitsALargerMicroBatch) {
  const std::string cfg = config(3) + " --set model.seq_len=1024 --set model.d_model=64 --set model.n_head=4" +
                          " --set train.global_batch=8 --set train.threads=2";
  const int64_t scores = 4LL * 1024 * 1024;  // n_head x T^2
  auto plan_with = [&](const std::string& attention, const std::string& budget) {
    return run("plan --config " + cfg + " --set model.attention=" + attention + " --memory-budget " + budget +
               " --out " + (dir_ / (attention + budget)).string());
  };
  auto plain = plan_with("plain", "64MiB");
  ASSERT_EQ(plain.code, 0) << plain.err;
  auto sdpa = plan_with("sdpa", "64MiB");
  ASSERT_EQ(sdpa.code, 0) << sdpa.err;
  const auto pp = nlohmann::json::parse(slurp(dir_ / "plain64MiB" / "plan.json"));
  const auto ps = nlohmann::json::parse(slurp(dir_ / "sdpa64MiB" / "plan.json"));
  const int64_t fixed = pp["fixed_minimum_bytes"].get<int64_t>(), limit = pp["limit_bytes"].get<int64_t>();

  int pruned = 0;
  for (const auto& r : pp["candidates"]) {
    const std::string what = r.dump();
    const std::string prec = r["precision"], policy = r["recompute"];
    const int64_t e = prec == "fp32" ? 4 : 2, m = r["micro_batch"].get<int64_t>();
    // The term: none keeps both layers' probabilities, a recompute policy one layer's rerun.
    const int64_t term = (policy == "none" ? 2 : 1) * scores * e;
    EXPECT_EQ(r["attention_bytes_per_sample"].get<int64_t>(), term) << what;
    // Micro-batch 8 runs without accumulation: its gradients are freed before the forward
    // (Note [Planner probe]), so its floor leaves them out: 169,728 fp32 parameters (wte 64x64,
    // wpe 1024x64, 2 blocks of 49,984, ln_f 128).
    const int64_t gradients = m == 8 ? 169728 * 4 : 0;
    EXPECT_EQ(r["floor_peak_bytes"].get<int64_t>(), fixed - gradients + (term + 2 * scores * e) * m) << what;
    EXPECT_TRUE(r["same_as"].is_null()) << what;
    // The floor is a lower bound of every measured peak.
    if (r["probed"].get<bool>()) EXPECT_GE(r["measured_peak_bytes"].get<int64_t>(), r["floor_peak_bytes"].get<int64_t>()) << what;
    if (r["attention_pruned"].get<bool>()) {
      ++pruned;
      EXPECT_FALSE(r["probed"].get<bool>()) << what;
      EXPECT_FALSE(r["oom"].get<bool>()) << what;
      EXPECT_GT(r["floor_peak_bytes"].get<int64_t>(), limit) << what;
    }
    // fp32 none: 2.6 MiB + 64 MiB at micro-batch 1 is over the limit already: no probe at all.
    if (prec == "fp32" && policy == "none") EXPECT_TRUE(r["attention_pruned"].get<bool>()) << what;
  }
  EXPECT_GE(pruned, 10);
  for (const auto& f : pp["fits"])
    if (f["precision"] == "fp32") EXPECT_EQ(f["attention_core"], "plain") << f.dump();
  EXPECT_NE(plain.out.find("pruned:attn"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("fp32 none: no probe fitted; attention 32.00 MiB/sample (plain)"), std::string::npos)
      << plain.out;

  std::map<int64_t, nlohmann::json> none32;
  for (const auto& r : ps["candidates"]) {
    EXPECT_EQ(r["attention_bytes_per_sample"].get<int64_t>(), 0) << r.dump();
    EXPECT_EQ(r["floor_peak_bytes"].get<int64_t>(), -1) << r.dump();
    EXPECT_FALSE(r["attention_pruned"].get<bool>()) << r.dump();
    if (r["precision"] == "fp32" && r["recompute"] == "none") none32[r["micro_batch"].get<int64_t>()] = r;
  }
  int same = 0;
  for (const auto& r : ps["candidates"]) {
    if (r["precision"] != "fp32" || r["recompute"] != "selective") continue;
    ++same;
    EXPECT_EQ(r["same_as"], "none");
    EXPECT_FALSE(r["probed"].get<bool>());
    EXPECT_FALSE(r["fits"].get<bool>());
    const auto& n = none32.at(r["micro_batch"].get<int64_t>());
    EXPECT_EQ(r["predicted_peak_bytes"], n["predicted_peak_bytes"]);
    EXPECT_EQ(r["predicted_samples_per_s"], n["predicted_samples_per_s"]);
  }
  EXPECT_EQ(same, 4);
  for (const auto& f : ps["fits"]) {
    if (f["precision"] != "fp32") continue;
    EXPECT_EQ(f["attention_core"], "sdpa: flash attention");
    if (f["recompute"] == "selective") {
      EXPECT_EQ(f["same_as"], "none");
      EXPECT_EQ(f["points"], 0);
    }
  }
  EXPECT_NE(sdpa.out.find("fp32 selective: same as none, not probed (sdpa: flash attention keeps no [B,H,T,T] "
                          "tensors for selective to drop)"),
            std::string::npos)
      << sdpa.out;
  // SDPA fits a larger micro-batch under the same budget (fp32 none at 4: 40 MiB measured;
  // plain: at most 2, with recompute). The largest that fits, not the choice, which the
  // timings of close candidates decide.
  auto largest_fit = [](const nlohmann::json& plan) {
    int64_t m = 0;
    for (const auto& r : plan["candidates"])
      if (r["fits"].get<bool>()) m = std::max(m, r["micro_batch"].get<int64_t>());
    return m;
  };
  EXPECT_GE(largest_fit(ps), 4);
  EXPECT_LE(largest_fit(pp), 2);
  EXPECT_GT(largest_fit(ps), largest_fit(pp));
  EXPECT_EQ(none32.at(4)["fits"], true);

  // Under 24 MiB (limit 21.6 MiB) plain's floors put every candidate over: refused without a
  // single probe, naming the attention; SDPA fits.
  const auto t0 = std::chrono::steady_clock::now();
  auto none_fit = plan_with("plain", "24MiB");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(none_fit.code, 2) << none_fit.err;
  EXPECT_NE(none_fit.err.find("the attention cores' [B,H,T,T] tensors alone put every candidate over the limit"),
            std::string::npos)
      << none_fit.err;
  EXPECT_NE(none_fit.err.find("use model.attention = \"sdpa\" with model.dropout = 0"), std::string::npos)
      << none_fit.err;
  EXPECT_LT(seconds, 10.0);
  auto fits = plan_with("sdpa", "24MiB");
  EXPECT_EQ(fits.code, 0) << fits.err;
}

// Note [Model state in the plan]: memory.optimizer_state = auto (one rank) and memory.shard =
// auto (two ranks) let the planner fit a model whose FP32, unsharded model state alone is over
// the limit: the budget minimum it refuses below follows the most saving option, the choice
// names the option, and `train --auto` runs under it with every step's peak under the budget.
TEST_F(Planner, ModelStateOptionsFitWhereUnshardedFp32StateDoesNot) {
  // d_model 128: most tensors are over the 4096 elements 8-bit moments need.
  const std::string wide = " --set model.d_model=128 --set model.n_head=4";
  auto minimum = [&](const std::string& launcher, const std::string& sets, const std::string& out) {
    auto r = run_cmd(launcher + LEANTRAIN_BINARY + " plan --config " + config(3) + wide + sets +
                     " --memory-budget 100KiB --out " + (dir_ / out).string());
    EXPECT_EQ(r.code, 2) << r.err;
    const auto at = r.err.find("at least ");
    return at == std::string::npos ? int64_t{-1} : std::stoll(r.err.substr(at + 9));
  };
  for (const bool two_ranks : {false, true}) {
    SCOPED_TRACE(two_ranks ? "2 ranks, memory.shard = auto" : "1 rank, memory.optimizer_state = auto");
    const std::string launcher = two_ranks ? mpirun(2) : std::string();
    const std::string option = two_ranks ? " --set memory.shard=auto" : " --set memory.optimizer_state=auto";
    const std::string tag = two_ranks ? "two" : "one";
    const int64_t fp32 = minimum(launcher, "", tag + "_min32"), saved = minimum(launcher, option, tag + "_minauto");
    ASSERT_GT(saved, 0);
    // The moments shrink to a quarter (one rank), the optimizer state and buckets to half (two).
    EXPECT_LT(saved, two_ranks ? fp32 : fp32 * 3 / 4) << saved << " vs " << fp32;
    // A budget whose limit (90 %) is under the unsharded FP32 fixed part: refused without the option.
    const int64_t budget = fp32;
    auto refused = run_cmd(launcher + LEANTRAIN_BINARY + " plan --config " + config(3) + wide +
                           " --memory-budget " + std::to_string(budget) + " --out " + (dir_ / (tag + "_no")).string());
    EXPECT_EQ(refused.code, 2) << refused.err;
    const auto out = dir_ / (tag + "_run");
    auto r = run_cmd(launcher + LEANTRAIN_BINARY + " train --config " + config(6) + wide + option +
                     " --auto --memory-budget " + std::to_string(budget) + " --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto plan = events(out, "plan");
    ASSERT_EQ(plan.size(), 1u);
    const auto cfg = nlohmann::json::parse(slurp(out / "config.json"));
    if (two_ranks) {
      EXPECT_NE(plan[0]["shard"], "none") << plan[0].dump();
      EXPECT_EQ(cfg["memory"]["shard"], plan[0]["shard"]);
      EXPECT_EQ(plan[0]["optimizer_state"], "fp32");
    } else {
      EXPECT_EQ(plan[0]["optimizer_state"], "int8") << plan[0].dump();
      EXPECT_EQ(cfg["memory"]["optimizer_state"], "int8");
    }
    expect_steps_within(out, budget, 6);
    // The plan's predicted peak bounds what the steps measured (Note [Model state in the
    // plan]: the savings are taken off the unsharded probe's peak, which may fall where the
    // option saves less, and sharded gradients count two buckets live, here the whole model's).
    for (const auto& s : events(out, "step"))
      EXPECT_LE(s["peak_mem_bytes"].get<int64_t>(), plan[0]["predicted_peak_bytes"].get<int64_t>() * 102 / 100)
          << s.dump();
  }
}

TEST_F(Planner, AutoAndPlanNeedABudget) {
  expect_config_error("train --config " + config(3) + " --auto --out " + (dir_ / "a").string(),
                      "--auto needs a memory budget: --memory-budget SIZE (or memory.budget)");
  expect_config_error("plan --config " + config(3) + " --out " + (dir_ / "p").string(),
                      "leantrain plan needs a budget: --memory-budget SIZE");
}

}  // namespace
