// The command line end to end: the real binary, its exit codes, its one-line errors and the
// files a run writes. Torch-free: it only runs processes and reads files.
#include "cli_fixture.h"

TEST_F(Cli, VersionNamesTheLibraries) {
  auto r = run("--version");
  EXPECT_EQ(r.code, 0);
  for (const char* s : {"leantrain 0.", "LibTorch 2.", "HDF5 1.", "MPI ", "NCCL "})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " missing in:\n" << r.out;
}

TEST_F(Cli, HelpListsTrain) {
  auto r = run("--help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("train"), std::string::npos);
  r = run("train --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("--set"), std::string::npos);
}

TEST_F(Cli, BadUsageExitsTwo) {
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("frobnicate").code, 2);
  EXPECT_EQ(run("train").code, 2);  // --config is required
  expect_config_error("train --config /nonexistent.toml", "/nonexistent.toml");
}

// The deprecated spelling of memory.recompute still trains, with one warning line; config.json
// writes the key as memory.recompute.
TEST_F(Cli, DeprecatedRecomputeKeyTrainsWithOneWarning) {
  const auto out = dir_ / "run";
  auto r = run("train --config " + demo() + " --set memory.activation_checkpoint=full --set train.steps=1 " +
               "--set checkpoint.at_end=false --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string all = r.out + r.err, line = "--set: memory.activation_checkpoint is deprecated; write memory.recompute";
  EXPECT_NE(all.find(line), std::string::npos) << all;
  EXPECT_EQ(all.find(line), all.rfind(line)) << "printed twice:\n" << all;
  const auto cfg = nlohmann::json::parse(slurp(out / "config.json"));
  EXPECT_EQ(cfg["memory"]["recompute"], "full") << cfg["memory"].dump();
  for (const auto& [key, value] : cfg["memory"].items())
    EXPECT_EQ(key.find("checkpoint"), std::string::npos) << "config.json writes the old key: " << cfg["memory"].dump();
}

TEST_F(Cli, UnknownKeyExitsTwoNamingIt) {
  expect_config_error("train --config " + demo() + " --set train.learning_rate=1", "train.learning_rate");
  std::ofstream(dir_ / "bad.toml") << "[train]\nbogus = 1\n";
  expect_config_error("train --config " + (dir_ / "bad.toml").string(), "unknown key train.bogus");
}

TEST_F(Cli, WrongTypeExitsTwoNamingIt) {
  expect_config_error("train --config " + demo() + " --set train.micro_batch='\"eight\"'",
                      "train.micro_batch: expected an integer, got a string");
}

TEST_F(Cli, IndivisibleGlobalBatchExitsTwo) {
  expect_config_error("train --config " + demo() + " --set train.global_batch=100 --set train.micro_batch=64",
                      "train.global_batch = 100");
}

TEST_F(Cli, NegativeSizeExitsTwo) {
  expect_config_error("train --config " + demo() + " --set model.width=-16", "model.width = -16");
  expect_config_error("train --config " + demo() + " --set train.micro_batch=-1", "train.micro_batch = -1");
}

// Opt-in linear lr scaling: the same recipe at twice its reference global batch runs at
// twice the learning rate at every step (warmup and cosine shape unchanged).
TEST_F(Cli, LinearLrScalingFollowsTheGlobalBatch) {
  const std::string cfg = tiny_gpt_config(0.0, 4);
  ASSERT_EQ(run("train --config " + cfg + " --set train.global_batch=32 --out " + (dir_ / "plain").string()).code, 0);
  // Note [What ran]: config.json names the attention kernel LibTorch picked (GPT, dropout 0:
  // the CPU's flash kernel), and the device.
  const auto ran = nlohmann::json::parse(slurp(dir_ / "plain" / "config.json"));
  EXPECT_EQ(ran["runtime"]["device"], "cpu");
  EXPECT_NE(ran["runtime"]["compute"].get<std::string>().find("attention sdpa: flash attention"), std::string::npos)
      << ran.dump();
  auto r = run("train --config " + cfg + " --set train.global_batch=32 --set train.lr_scaling=linear" +
               " --set train.lr_reference_batch=16 --out " + (dir_ / "scaled").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("linear lr scaling"), std::string::npos) << r.err;
  auto lrs = [](const fs::path& run_dir) {
    std::vector<double> v;
    for (const auto& j : events(run_dir, "step")) v.push_back(j["lr"].get<double>());
    return v;
  };
  const auto a = lrs(dir_ / "plain"), b = lrs(dir_ / "scaled");
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], 2.0 * a[i], 1e-15) << "step " << i + 1;
}

TEST_F(Cli, StartOptionsExcludeEachOther) {
  expect_config_error("train --config " + demo() + " --resume auto --init-from x.h5",
                      "--resume and --init-from exclude each other");
  expect_config_error("train --config " + demo() + " --init-skip-mismatched", "--init-skip-mismatched needs --init-from");
}

TEST_F(Cli, MissingDataPathExitsTwo) {
  expect_config_error("train --config " + demo() + " --set data.path=/nonexistent/fmnist", "data.path");
}

TEST_F(Cli, UnavailableFeaturesAreConfigErrorsNotCrashes) {
  // "auto" is resolved by the memory planner (train --auto); a plain run cannot take it.
  expect_config_error("train --config " + demo() + " --set memory.recompute=auto", "memory.recompute = 'auto'");
}

TEST_F(Cli, TrainsAndWritesMetrics) {
  const auto out = dir_ / "run";
  auto r = run("train --config " + demo() + " --set train.steps=30 --set data.limit=3840" +
               " --set train.eval_max_batches=2 --set train.warmup_steps=5 --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  ASSERT_TRUE(fs::exists(out / "config.json"));
  EXPECT_EQ(nlohmann::json::parse(slurp(out / "config.json"))["train"]["steps"], 30);
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  std::vector<double> losses;
  int epochs = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ASSERT_TRUE(j.contains("event"));
    if (j["event"] == "step") {
      for (const char* k : {"step", "loss", "lr", "loss_scale", "samples_per_s", "step_time_s",
                            "comm_time_s", "peak_mem_bytes"})
        ASSERT_TRUE(j.contains(k) && j[k].is_number()) << k << " in " << line;
      EXPECT_GT(j["peak_mem_bytes"].get<int64_t>(), 0);
      EXPECT_GT(j["samples_per_s"].get<double>(), 0);
      // Building the step's samples is part of the step, and only part of it.
      ASSERT_TRUE(j.contains("data_time_s") && j["data_time_s"].is_number()) << line;
      EXPECT_GT(j["data_time_s"].get<double>(), 0);
      EXPECT_LT(j["data_time_s"].get<double>(), j["step_time_s"].get<double>());
      losses.push_back(j["loss"].get<double>());
    } else if (j["event"] == "epoch") {
      ++epochs;
      for (const char* k : {"eval_loss", "eval_accuracy", "epoch_time_s", "samples_per_s", "peak_mem_bytes"})
        ASSERT_TRUE(j.contains(k) && j[k].is_number()) << k << " in " << line;
      EXPECT_GT(j["eval_accuracy"].get<double>(), 0.3);  // chance is 0.1
    }
  }
  ASSERT_EQ(losses.size(), 30u);
  EXPECT_EQ(epochs, 1);
  double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_LT(last, 0.7 * first) << "loss did not fall: " << first << " -> " << last;
}

// Reads the last `epoch` event's eval_loss from a run directory.
double final_eval_loss(const fs::path& run_dir) {
  std::ifstream in(run_dir / "metrics.jsonl");
  std::string line;
  double loss = -1;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "epoch") loss = j["eval_loss"].get<double>();
  }
  return loss;
}

// data.eval_fraction = 0 holds nothing out: the run trains and evaluates nothing (the Trainer
// takes a null eval set), saying so instead of reporting an eval loss of 0.
TEST_F(Cli, NoHeldOutTextTrainsWithoutEvaluation) {
  const auto corpus = dir_ / "corpus.txt";
  {
    std::ofstream f(corpus);
    for (int i = 0; i < 400; ++i) f << "the quick brown fox jumps over the lazy dog " << i << "\n";
  }
  const auto cfg = dir_ / "text.toml";
  std::ofstream(cfg) << "[model]\nkind = \"gpt\"\nvocab_size = 256\nseq_len = 16\nn_layer = 1\nn_head = 2\n"
                        "d_model = 16\n[data]\nkind = \"text\"\npath = \""
                     << corpus.string()
                     << "\"\neval_fraction = 0.0\n[train]\nglobal_batch = 8\nmicro_batch = 8\nsteps = 3\n"
                        "threads = 1\n[log]\nprogress = \"none\"\n";
  auto r = run("train --config " + cfg.string() + " --out " + (dir_ / "run").string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("no eval set"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("eval loss"), std::string::npos) << r.err;
  const auto epochs = events(dir_ / "run", "epoch");
  ASSERT_EQ(epochs.size(), 1u);
  EXPECT_FALSE(epochs[0].contains("eval_loss"));
  EXPECT_EQ(events(dir_ / "run", "step").size(), 3u);
}

TEST_F(Cli, SgdWithMomentumTrains) {
  const auto out = dir_ / "sgd";
  auto r = run("train --config " + std::string(LEANTRAIN_SOURCE_DIR) + "/configs/fashion_mnist_mlp.toml" +
               " --set train.optimizer=sgd --set train.lr=0.05 --set train.steps=40 --set train.eval_max_batches=4" +
               " --set log.progress=none --out " + out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out / "metrics.jsonl");
  double acc = -1;
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "epoch") acc = j["eval_accuracy"].get<double>();
  }
  EXPECT_GT(acc, 0.5);  // chance is 0.1
}

TEST_F(Cli, Bf16DemoEndsWithinTwoPercentOfFp32) {
  // The demo config, shortened: 60 steps, evaluation on 2,500 test images.
  const std::string common = "train --config " + demo() +
                             " --set train.steps=60 --set train.eval_max_batches=5 --set log.progress=none";
  auto fp32 = run(common + " --set precision.mode=fp32 --out " + (dir_ / "fp32").string());
  ASSERT_EQ(fp32.code, 0) << fp32.err;
  auto bf16 = run(common + " --set precision.mode=bf16 --out " + (dir_ / "bf16").string());
  ASSERT_EQ(bf16.code, 0) << bf16.err;
  const double a = final_eval_loss(dir_ / "fp32"), b = final_eval_loss(dir_ / "bf16");
  ASSERT_GT(a, 0);
  EXPECT_LT(std::abs(b - a) / a, 0.02) << "fp32 " << a << " bf16 " << b;
  EXPECT_LT(a, 1.5);  // it trained (chance level is ln 10 = 2.30)
}

TEST_F(Cli, Fp16RunsWithLossScaleInMetrics) {
  const auto out = dir_ / "fp16";
  auto r = run("train --config " + demo() + " --set model.kind=mlp --set model.hidden=[64] --set precision.mode=fp16" +
               " --set train.steps=5 --set train.eval_max_batches=1 --out " + out.string());
  if (r.code == 2 && r.err.find("precision.mode = 'fp16'") != std::string::npos)
    GTEST_SKIP() << "this LibTorch cannot run fp16 on the CPU: " << r.err;
  ASSERT_EQ(r.code, 0) << r.err;
  std::ifstream in(out / "metrics.jsonl");
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(nlohmann::json::parse(line)["loss_scale"].get<double>(), 65536.0);
}

// Data parallelism is exact: 2 ranks x micro m x accumulation k, 1 rank x m x 2k and
// 1 rank x 2m x k see the same samples per step and average the same gradients (fp32,
// dropout 0), so they log the same losses and end at the same weights.
//
// Note [Adam and weights at 1e-5]: the key bias of attention (a third of qkv.bias) has an
// exact zero gradient (softmax ignores a shift shared by all keys), so what it receives is
// summation-order rounding noise, ~1e-9, which Adam divides by sqrt(v) ~ 1e-9 (+ eps) and
// turns into updates of ~0.1 lr whose sign is the noise's. Any change of reduction order —
// 2 ranks vs 1, micro-batch 4 vs 8, DDP as much as leantrain — moves those weights by
// ~1e-4 relative. So the weight-for-weight comparison runs with SGD + momentum, where an
// update is proportional to its gradient; with AdamW the losses must still agree to 1e-5.
TEST_F(Cli, TwoRanksMatchOneRankUnderMpirun) {
  const std::string cfg = tiny_gpt_config(0.0, 10);
  const std::string mpi = mpirun(2);
  for (const std::string opt : {"adamw", "sgd"}) {
    SCOPED_TRACE(opt);
    const std::string base = " train --config " + cfg + " --set train.optimizer=" + opt +
                             (opt == "sgd" ? " --set train.lr=0.05" : "") + " --out " + (dir_ / opt).string();
    // Tiny buckets (8 KiB) so the model's gradients span several of them.
    auto two = run_cmd(mpi + LEANTRAIN_BINARY + base + "_two --set train.micro_batch=4" +
                       " --set comm.first_bucket_mb=0.004 --set comm.bucket_mb=0.008");
    ASSERT_EQ(two.code, 0) << two.err;
    EXPECT_NE(two.err.find("world 2"), std::string::npos) << two.err;
    auto a = run(base + "_one_4x4 --set train.micro_batch=4");
    ASSERT_EQ(a.code, 0) << a.err;
    auto b = run(base + "_one_8x2 --set train.micro_batch=8");
    ASSERT_EQ(b.code, 0) << b.err;
    const auto [l2, e2] = losses_of(dir_ / (opt + "_two"));
    ASSERT_EQ(l2.size(), 10u);
    // Communication: none while micro-batches run, exactly one all-reduce per bucket per step.
    std::ifstream in(dir_ / (opt + "_two") / "metrics.jsonl");
    int steps = 0;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      if (j["event"] != "step") continue;
      ++steps;
      EXPECT_EQ(j["comm_calls_in_microbatches"].get<int64_t>(), 0) << line;
      EXPECT_GE(j["grad_buckets"].get<int64_t>(), 3) << line;
      EXPECT_EQ(j["grad_allreduce_calls"].get<int64_t>(), j["grad_buckets"].get<int64_t>()) << line;
      // Note [Gradients stay in the buckets]: from step 2 no gradient lives outside them.
      if (j["step"].get<int>() >= 2) EXPECT_EQ(j["mem_grads_bytes"].get<int64_t>(), 0) << line;
      EXPECT_GE(j["mem_comm_buffers_bytes"].get<int64_t>(), j["mem_params_bytes"].get<int64_t>()) << line;
    }
    EXPECT_EQ(steps, 10);
    // Evaluation is sharded: rank 0 of two evaluated half of the 64 eval samples (2 batches
    // of 32), one rank all of them, and they agree on the loss (below).
    const auto two_epoch = events(dir_ / (opt + "_two"), "epoch");
    ASSERT_EQ(two_epoch.size(), 1u);
    EXPECT_EQ(two_epoch[0]["eval_shard_samples"].get<int64_t>(), 32);
    EXPECT_EQ(events(dir_ / (opt + "_one_4x4"), "epoch")[0]["eval_shard_samples"].get<int64_t>(), 64);
    for (const std::string other : {"_one_4x4", "_one_8x2"}) {
      const auto [l1, e1] = losses_of(dir_ / (opt + other));
      ASSERT_EQ(l1.size(), 10u) << other;
      for (size_t i = 0; i < l1.size(); ++i)
        EXPECT_NEAR(l2[i], l1[i], 1e-5 * std::abs(l1[i])) << other << " step " << i + 1;
      EXPECT_NEAR(e2, e1, 1e-5 * std::abs(e1)) << other;
      if (opt == "sgd") {
        // Parameters equal within 1e-5 relative, tensor by tensor (final checkpoints).
        const std::string ck = "/checkpoints/step-00000010.h5";
        auto cmp = compare_checkpoints((dir_ / (opt + "_two")).string() + ck, (dir_ / (opt + other)).string() + ck,
                                       1e-5);
        EXPECT_EQ(cmp.code, 0) << other << ": " << cmp.out << cmp.err;
      }
    }
    EXPECT_LT(l2.back(), l2.front());  // and it trained
  }
}

TEST_F(Cli, MpirunWithIndivisibleBatchExitsTwoOnEveryRank) {
  auto r = run_cmd(mpirun(2) + LEANTRAIN_BINARY + " train --config " + demo() +
                   " --set train.global_batch=96 --set train.micro_batch=64 --out " + (dir_ / "x").string());
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("train.global_batch = 96"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("x 2 = 128"), std::string::npos) << r.err;
}

// configs/llama_tiny.toml (the llama kind: grouped-query attention through SDPA's enable_gqa,
// RoPE, SwiGLU, a tied head) trains on the CPU with the loss falling, logs its attention kernel,
// and its checkpoint holds the llama names (no lm_head when tied); `plan` probes it.
TEST_F(Cli, LlamaTinyConfigTrains) {
  const std::string config = std::string(LEANTRAIN_SOURCE_DIR) + "/configs/llama_tiny.toml";
  const auto out = dir_ / "run";
  auto r = run("train --config " + config + " --set train.steps=30 --set train.eval_max_batches=1 --out " +
               out.string());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("4 query / 2 key-value heads through enable_gqa"), std::string::npos) << r.err;
  std::vector<double> losses;
  for (const auto& j : events(out, "step")) losses.push_back(j["loss"].get<double>());
  ASSERT_EQ(losses.size(), 30u);
  const double first = (losses[0] + losses[1] + losses[2]) / 3, last = (losses[27] + losses[28] + losses[29]) / 3;
  EXPECT_LT(last, 0.7 * first) << "loss did not fall: " << first << " -> " << last;
  auto ins = run("inspect " + ck(out, 30));
  ASSERT_EQ(ins.code, 0) << ins.err;
  for (const char* name : {"embed_tokens.weight", "blocks.3.self_attn.k_proj.weight [64, 128]",
                           "blocks.0.mlp.gate_proj.weight [344, 128]", "norm.weight"})
    EXPECT_NE(ins.out.find(name), std::string::npos) << name << "\n" << ins.out;
  EXPECT_EQ(ins.out.find("lm_head"), std::string::npos) << ins.out;
  auto plan = run("plan --config " + config + " --memory-budget 64MiB --out " + (dir_ / "plan").string());
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("chosen:"), std::string::npos) << plan.out;
}
