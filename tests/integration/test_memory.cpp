// The memory budget end to end (memory.budget / --memory-budget, docs/PLANNER.md): a hard
// limit enforced on the CPU by the tracking allocator, refused at startup below what the
// parameters, gradients and optimizer state need, and an out-of-memory error in a step
// backs off to a smaller micro-batch without changing the samples or the losses. Budgets are
// placed between peaks measured by the test itself, never hard-coded.
#include "cli_fixture.h"

namespace {

int64_t max_peak(const fs::path& run) {
  int64_t peak = 0;
  for (const auto& s : events(run, "step")) peak = std::max(peak, s["peak_mem_bytes"].get<int64_t>());
  return peak;
}

class Memory : public Cli {
 protected:
  // The tiny GPT, fp32, no dropout: global batch 16 = micro 8 x 2 accumulation.
  std::string train(int steps, const std::string& out, const std::string& more = "") {
    return std::string(LEANTRAIN_BINARY) + " train --config " + tiny_gpt_config(0.0, steps) + " --out " +
           (dir_ / out).string() + " " + more;
  }
  // Peak of a run with this micro-batch and no budget.
  int64_t measured_peak(int micro, int steps = 3, const std::string& sets = "") {
    const std::string out = "peak" + std::to_string(micro);
    auto r = run_cmd(train(steps, out, sets + "--set train.micro_batch=" + std::to_string(micro)));
    EXPECT_EQ(r.code, 0) << r.err;
    return max_peak(dir_ / out);
  }

  void check_backoff(const std::string& sets) {
    measured_peak(8, 6, sets);
    const int64_t peak8_step1 = events(dir_ / "peak8", "step").at(0)["peak_mem_bytes"].get<int64_t>();
    const int64_t peak4 = measured_peak(4, 6, sets);
    ASSERT_LT(peak4, peak8_step1);
    const int64_t budget = (peak4 + peak8_step1) / 2;
    auto r = run_cmd(train(6, "run", sets + "--memory-budget " + std::to_string(budget)));
    ASSERT_EQ(r.code, 0) << r.err;
    const auto backoffs = events(dir_ / "run", "oom_backoff");
    ASSERT_EQ(backoffs.size(), 1u);
    EXPECT_EQ(backoffs[0]["step"], 1);
    EXPECT_EQ(backoffs[0]["old_micro_batch"], 8);
    EXPECT_EQ(backoffs[0]["old_accumulation"], 2);
    EXPECT_EQ(backoffs[0]["new_micro_batch"], 4);
    EXPECT_EQ(backoffs[0]["new_accumulation"], 4);
    EXPECT_NE(r.err.find("warning step 1: out of memory with micro-batch 8"), std::string::npos) << r.err;

    const auto steps = events(dir_ / "run", "step");
    ASSERT_EQ(steps.size(), 6u);
    for (const auto& s : steps) {
      EXPECT_LE(s["peak_mem_bytes"].get<int64_t>(), budget);
      EXPECT_EQ(s["micro_batch"].get<int64_t>(), 4);
      EXPECT_EQ(s["accumulation"].get<int64_t>(), 4);
    }
    const auto [got, got_eval] = losses_of(dir_ / "run");
    const auto [want, want_eval] = losses_of(dir_ / "peak4");
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
    // Evaluation may have backed off too (warning), over the same samples.
    EXPECT_NEAR(got_eval, want_eval, 1e-5 * std::abs(want_eval));
    // The checkpoint records the micro-batch the run continued with.
    auto info = run("inspect " + (dir_ / "run" / "checkpoints" / "step-00000006.h5").string() + " --json");
    ASSERT_EQ(info.code, 0) << info.err;
    const auto j = nlohmann::json::parse(info.out);
    EXPECT_EQ(j["micro_batch"], 4);
    EXPECT_EQ(j["accumulation"], 4);
  }
};

// Note [Memory breakdown] (trainers/src/trainer.cpp), checked against numbers the test
// derives itself, not only against each other:
//  - parameters: the GPT-2 layout of the tiny config (models/include/leantrain/models/gpt.h)
//    counted here from its sizes, and the same count from the checkpoint's tensors read back
//    with `leantrain inspect --json`; 4 bytes each (fp32);
//  - gradients: one rank keeps every gradient outside buckets: 4 bytes per parameter;
//  - optimizer state: 0 before the first update, then AdamW's two fp32 moments (8 bytes per
//    parameter), also while the background checkpoint writer holds a snapshot (checkpoints
//    every step here: the snapshot is "other", not optimizer state);
//  - activations: more than backward must keep of one micro-batch at the least (each
//    block's [micro, seq, d_model] fp32 input, for its LayerNorm's backward), less than the
//    peak; the peak holds at least parameters + gradients + moments + that;
//  - and the parts still add up to the peak (the documented identity).
TEST_F(Memory, BreakdownAddsUpToThePeakAndOptimizerStateIsTheMoments) {
  auto r = run_cmd(train(5, "run", "--set checkpoint.every_steps=1"));
  ASSERT_EQ(r.code, 0) << r.err;
  // The sizes of tiny_gpt_config (cli_fixture.h), and the run's resolved config agreeing.
  const int64_t V = 64, S = 32, L = 2, D = 32, F = 4 * D, micro = 8;
  const auto config = nlohmann::json::parse(slurp(dir_ / "run" / "config.json"));
  ASSERT_EQ(config["model"]["kind"], "gpt");
  ASSERT_EQ(config["model"]["vocab_size"], V);
  ASSERT_EQ(config["model"]["seq_len"], S);
  ASSERT_EQ(config["model"]["n_layer"], L);
  ASSERT_EQ(config["model"]["d_model"], D);
  ASSERT_EQ(config["model"]["d_ff"], 0);  // 0 means 4 * d_model
  ASSERT_EQ(config["train"]["micro_batch"], micro);
  ASSERT_EQ(config["train"]["optimizer"], "adamw");
  // wte [V,D], wpe [S,D]; per block ln1, ln2 (2D each), qkv [3D,D]+3D, proj [D,D]+D,
  // mlp.fc [F,D]+F, mlp.proj [D,F]+D; ln_f 2D; the head is tied to wte.
  const int64_t n_params =
      V * D + S * D + L * (2 * D + 3 * D * D + 3 * D + D * D + D + 2 * D + F * D + F + D * F + D) + 2 * D;
  EXPECT_EQ(n_params, 28544);
  // The checkpoint's tensors: the same count (GPT has no buffers).
  auto info = run("inspect " + ck(dir_ / "run", 5) + " --json");
  ASSERT_EQ(info.code, 0) << info.err;
  const auto stored = nlohmann::json::parse(info.out);
  ASSERT_EQ(stored["model"].size(), 2u + 12u * L + 2u) << info.out;  // GPT: no buffers
  int64_t n_stored = 0;
  for (const auto& t : stored["model"]) {
    int64_t n = 1;
    for (const auto& d : t["shape"]) n *= d.get<int64_t>();
    n_stored += n;
  }
  EXPECT_EQ(n_stored, n_params);

  const int64_t param_bytes = 4 * n_params;
  const int64_t activations_floor = L * micro * S * D * 4;
  const auto steps = events(dir_ / "run", "step");
  ASSERT_EQ(steps.size(), 5u);
  for (const auto& s : steps) {
    SCOPED_TRACE(s.dump());
    const int64_t params = s["mem_params_bytes"].get<int64_t>();
    const int64_t grads = s["mem_grads_bytes"].get<int64_t>();
    const int64_t optimizer = s["mem_optimizer_bytes"].get<int64_t>();
    const int64_t activations = s["mem_activations_bytes"].get<int64_t>();
    const int64_t peak = s["peak_mem_bytes"].get<int64_t>();
    const int64_t moments = s["step"] == 1 ? 0 : 2 * param_bytes;
    EXPECT_EQ(params, param_bytes);
    EXPECT_EQ(grads, param_bytes);
    EXPECT_EQ(optimizer, moments);
    EXPECT_EQ(s["mem_comm_buffers_bytes"].get<int64_t>(), 0);  // one rank: no buckets
    EXPECT_GE(s["mem_other_bytes"].get<int64_t>(), 0);
    EXPECT_GT(activations, activations_floor);
    EXPECT_LT(activations, peak);
    EXPECT_GE(peak, param_bytes + param_bytes + moments + activations_floor);
    const int64_t sum = params + grads + optimizer + s["mem_comm_buffers_bytes"].get<int64_t>() +
                        s["mem_other_bytes"].get<int64_t>() + activations;
    EXPECT_EQ(sum, peak);
  }
}

TEST_F(Memory, BudgetBelowParametersGradientsAndOptimizerStateIsRefusedWithTheMinimum) {
  auto r = run_cmd(train(3, "run", "--memory-budget 100KiB"));
  EXPECT_EQ(r.code, 2) << r.err;
  const auto at = r.err.find("to at least ");
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_NE(r.err.find("config error: memory.budget = 100.00 KiB (102400 bytes) is below the"), std::string::npos)
      << r.err;
  // The minimum covers parameters (28544 fp32 = 114176 bytes) + gradients + 2 AdamW moments.
  const int64_t minimum = std::stoll(r.err.substr(at + 12));
  EXPECT_GE(minimum, 4 * 114176);
  EXPECT_LT(minimum, 4 * 114176 + 100000);
  EXPECT_FALSE(fs::exists(dir_ / "run" / "metrics.jsonl"));  // refused before training
}

TEST_F(Memory, PeakNeverExceedsASufficientBudgetAndTheFlagOverridesTheConfig) {
  const int64_t peak8 = measured_peak(8);
  const int64_t budget = peak8 + peak8 / 10;
  // The config's own budget is far too small; --memory-budget replaces it.
  auto r = run_cmd(train(4, "run", "--set memory.budget=100KiB --memory-budget " + std::to_string(budget)));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto steps = events(dir_ / "run", "step");
  ASSERT_EQ(steps.size(), 4u);
  for (const auto& s : steps) {
    EXPECT_LE(s["peak_mem_bytes"].get<int64_t>(), budget);
    EXPECT_EQ(s["micro_batch"].get<int64_t>(), 8);
  }
  EXPECT_TRUE(events(dir_ / "run", "oom_backoff").empty());
  EXPECT_NE(r.err.find("memory budget"), std::string::npos) << r.err;
}

// The test: under a budget between the peaks of micro-batch 4 and 8, step 1 runs out
// of memory, backs off to 4 x 4 and redoes the step: the same samples, so the losses match a
// run configured with micro-batch 4 from the start (1e-5 relative, every step).
TEST_F(Memory, OomBackoffKeepsTheSampleSequenceAndMatchesTheSmallerMicroBatch) { check_backoff(""); }

// The same through bf16 autocast and full recompute: the error may come from a block's rerun
// inside backward (Recompute.RerunClearsTheCastCacheAndAFailedRerunRestoresTheCallersState).
TEST_F(Memory, OomBackoffUnderBf16AndFullRecomputeMatchesTheSmallerMicroBatch) {
  check_backoff("--set precision.mode=bf16 --set memory.recompute=full ");
}

// Far below the peak: the back-off goes 8 -> 4 -> 2 -> 1, and micro-batch 1 that still does
// not fit stops the run (exit 1) with what to change.
TEST_F(Memory, BudgetFarBelowThePeakEndsWithAClearOutOfMemoryError) {
  const int64_t peak1 = measured_peak(1);
  const auto s2 = events(dir_ / "peak1", "step").at(1);  // optimizer state allocated by now
  const int64_t floor = s2["mem_params_bytes"].get<int64_t>() + s2["mem_optimizer_bytes"].get<int64_t>() +
                        s2["mem_grads_bytes"].get<int64_t>();
  ASSERT_LT(floor, peak1);
  const int64_t budget = (floor + peak1) / 2;
  auto r = run_cmd(train(3, "run", "--memory-budget " + std::to_string(budget)));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("leantrain: training stopped: step "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("out of memory with micro-batch 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("micro-batch 1 does not fit"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("raise memory.budget"), std::string::npos) << r.err;
  std::vector<int64_t> micros;
  for (const auto& b : events(dir_ / "run", "oom_backoff")) micros.push_back(b["new_micro_batch"].get<int64_t>());
  EXPECT_EQ(micros, (std::vector<int64_t>{4, 2, 1}));
  for (const auto& s : events(dir_ / "run", "step")) EXPECT_LE(s["peak_mem_bytes"].get<int64_t>(), budget);
}

// Under mpirun every rank backs off together: the step's out-of-memory flag is all-reduced
// with its loss before any update (Note [Out-of-memory back-off]). Here both ranks run out of
// memory in step 1; the losses match a 2-rank run with micro-batch 4 from the start.
TEST_F(Memory, OomBackoffUnderMpirunIsAgreedByEveryRank) {
  auto m8 = run_cmd(mpirun(2) + train(4, "peak8", "--set train.micro_batch=8"));
  ASSERT_EQ(m8.code, 0) << m8.err;
  auto m4 = run_cmd(mpirun(2) + train(4, "peak4", "--set train.micro_batch=4"));
  ASSERT_EQ(m4.code, 0) << m4.err;
  const int64_t peak8_step1 = events(dir_ / "peak8", "step").at(0)["peak_mem_bytes"].get<int64_t>();
  const int64_t peak4 = max_peak(dir_ / "peak4");
  ASSERT_LT(peak4, peak8_step1);
  const int64_t budget = (peak4 + peak8_step1) / 2;
  auto r = run_cmd(mpirun(2) + train(4, "run", "--memory-budget " + std::to_string(budget)));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto backoffs = events(dir_ / "run", "oom_backoff");
  ASSERT_EQ(backoffs.size(), 1u);
  EXPECT_EQ(backoffs[0]["step"], 1);
  EXPECT_EQ(backoffs[0]["ranks"], 2);
  EXPECT_EQ(backoffs[0]["old_micro_batch"], 8);
  EXPECT_EQ(backoffs[0]["old_accumulation"], 1);
  EXPECT_EQ(backoffs[0]["new_micro_batch"], 4);
  EXPECT_EQ(backoffs[0]["new_accumulation"], 2);
  for (const auto& s : events(dir_ / "run", "step")) EXPECT_LE(s["peak_mem_bytes"].get<int64_t>(), budget);
  const auto [got, got_eval] = losses_of(dir_ / "run");
  const auto [want, want_eval] = losses_of(dir_ / "peak4");
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
}

// The hard case: one rank alone runs out of memory in its last micro-batch, with its
// gradient hooks armed, while the other runs its backward and starts the gradient
// all-reduces. The failing rank still completes them, both learn of it from the step's
// flag, and both redo step 3 with micro-batch 4: no hang, no sample lost or counted twice
// (the losses stay those of the uninterrupted micro-batch-8 run, to fp32 summation order).
TEST_F(Memory, OomOnOneRankInItsLastBackwardIsRedoneByEveryRank) {
  auto ref = run_cmd(mpirun(2) + train(6, "ref"));
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto r = run_cmd("LEANTRAIN_FAULT=oom@3:1 " + mpirun(2) + train(6, "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto backoffs = events(dir_ / "run", "oom_backoff");
  ASSERT_EQ(backoffs.size(), 1u);
  EXPECT_EQ(backoffs[0]["step"], 3);
  EXPECT_EQ(backoffs[0]["ranks"], 1);
  EXPECT_EQ(backoffs[0]["new_micro_batch"], 4);
  EXPECT_NE(r.err.find("step 3: out of memory on 1 other rank(s) with micro-batch 8"), std::string::npos) << r.err;
  const auto steps = events(dir_ / "run", "step");
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_EQ(steps[1]["micro_batch"], 8);
  EXPECT_EQ(steps[2]["micro_batch"], 4);
  EXPECT_EQ(steps[2]["grad_allreduce_calls"], steps[1]["grad_allreduce_calls"]);  // the redo's, once
  const auto [got, got_eval] = losses_of(dir_ / "run");
  const auto [want, want_eval] = losses_of(dir_ / "ref");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
}

// The same injected error in a world of one.
TEST_F(Memory, InjectedOomBacksOffInAWorldOfOne) {
  auto ref = run_cmd(train(4, "ref"));
  ASSERT_EQ(ref.code, 0) << ref.err;
  auto r = run_cmd("LEANTRAIN_FAULT=oom@2 " + train(4, "run"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto backoffs = events(dir_ / "run", "oom_backoff");
  ASSERT_EQ(backoffs.size(), 1u);
  EXPECT_EQ(backoffs[0]["step"], 2);
  EXPECT_NE(r.err.find("injected out of memory (LEANTRAIN_FAULT oom@2)"), std::string::npos) << r.err;
  const auto [got, got_eval] = losses_of(dir_ / "run");
  const auto [want, want_eval] = losses_of(dir_ / "ref");
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-5 * std::abs(want[i])) << "step " << i + 1;
}

}  // namespace
