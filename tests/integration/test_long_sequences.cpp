// The long-sequence GPT configs (configs/gpt2_seq1024.toml, configs/gpt2_seq2048.toml; issue 26
// item 3) at their real sequence length, shrunk in depth and width with --set so a run takes
// seconds: under a budget that SDPA's fused kernel fits and plain attention does not, the run
// finishes, every step stays under the budget, and the loss falls; the same run with
// model.attention = "plain" cannot fit even micro-batch 1 and stops (exit 1) after backing
// off. Budgets are derived from the planner's analytic attention term (docs/PLANNER.md).
#include "cli_fixture.h"

namespace {

class LongSequence : public Cli {
 protected:
  static std::string config(const std::string& name) {
    return std::string(LEANTRAIN_SOURCE_DIR) + "/configs/" + name;
  }
  // The shrunk model: 2 layers, d_model 64, 4 heads, vocab 256, the config's own seq_len; fp32
  // (exact byte counts below), global batch 4, micro-batch 2.
  static std::string shrunk(int steps) {
    return " --set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 --set model.vocab_size=256"
           " --set precision.mode=fp32 --set train.global_batch=4 --set train.micro_batch=2"
           " --set train.steps=" + std::to_string(steps) +
           " --set train.warmup_steps=2 --set train.lr=5e-3 --set train.eval_max_batches=1 --set train.threads=2"
           " --set log.progress=none";
  }
  void run_at(const std::string& name, int64_t seq) {
    // Plain attention keeps 2 layers x 4 heads x T^2 x 4 bytes a sample (the planner's term);
    // SDPA keeps none. The budget: the fixed part and SDPA's activations at micro-batch 2 fit
    // with room; plain's probabilities of one sample alone take more than the budget.
    const int64_t plain_term = 2 * 4 * seq * seq * 4;  // 32 MiB at 1024, 128 MiB at 2048
    const int64_t budget = plain_term;
    const int steps = 16;
    const auto out = dir_ / "sdpa";
    auto r = run("train --config " + config(name) + shrunk(steps) + " --set memory.budget=" + std::to_string(budget) +
                 " --out " + out.string());
    ASSERT_EQ(r.code, 0) << r.err;
    const auto cfg = nlohmann::json::parse(slurp(out / "config.json"));
    EXPECT_EQ(cfg["model"]["seq_len"], seq);
    EXPECT_EQ(cfg["model"]["attention"], "sdpa");
    EXPECT_EQ(cfg["model"]["dropout"], 0.0);
    EXPECT_NE(r.err.find("attention sdpa: flash attention"), std::string::npos) << r.err;
    const auto s = events(out, "step");
    ASSERT_EQ(s.size(), static_cast<size_t>(steps));
    int64_t peak = 0;
    for (const auto& e : s) {
      peak = std::max(peak, e["peak_mem_bytes"].get<int64_t>());
      EXPECT_EQ(e["micro_batch"], 2);  // no back-off
    }
    EXPECT_LE(peak, budget);
    EXPECT_GT(peak, budget / 8);  // the run did allocate its activations
    EXPECT_TRUE(events(out, "oom_backoff").empty());
    // The loss falls (ln 256 = 5.55 at the start; batches of 4 differ a lot, so the mean of
    // the last 8 steps against the first step).
    const double first = s.front()["loss"].get<double>();
    double last = 0;
    for (size_t i = s.size() - 8; i < s.size(); ++i) last += s[i]["loss"].get<double>() / 8;
    EXPECT_LT(last, first - 0.5) << "loss " << first << " -> mean of the last 8 steps " << last;
    ::testing::Test::RecordProperty("peak_bytes", std::to_string(peak));
    ::testing::Test::RecordProperty("budget_bytes", std::to_string(budget));

    // Plain attention under the same budget: out of memory at micro-batch 2, backed off to 1,
    // out of memory again: the run stops with what to change.
    auto p = run("train --config " + config(name) + shrunk(steps) + " --set model.attention=plain --set memory.budget=" +
                 std::to_string(budget) + " --out " + (dir_ / "plain").string());
    EXPECT_EQ(p.code, 1) << p.err;
    EXPECT_NE(p.err.find("training stopped"), std::string::npos) << p.err;
  }
};

TEST_F(LongSequence, Seq1024FitsWithSdpaUnderABudgetPlainDoesNot) { run_at("gpt2_seq1024.toml", 1024); }

TEST_F(LongSequence, Seq2048FitsWithSdpaUnderABudgetPlainDoesNot) { run_at("gpt2_seq2048.toml", 2048); }

}  // namespace
