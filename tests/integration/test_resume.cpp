// Checkpoints end to end: exact resume (fp32 and bf16, 1 and 2 ranks), resume on another
// world size, preemption by signal, --resume auto falling back past a damaged file,
// --init-from, `leantrain inspect`, and every damaged-file case as a clear error.
#include <fcntl.h>
#include <spawn.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <thread>

#include "cli_fixture.h"

extern char** environ;

namespace {

// Step events in a run's metrics.jsonl while the run may still be appending to it: only
// complete lines count (a line being written is neither parsed nor counted).
size_t complete_step_lines(const fs::path& run) {
  const std::string text = slurp(run / "metrics.jsonl");
  size_t n = 0, begin = 0;
  for (size_t end; (end = text.find('\n', begin)) != std::string::npos; begin = end + 1)
    if (text.substr(begin, end - begin).find("\"event\":\"step\"") != std::string::npos)
      ++n;
  return n;
}

class Resume : public Cli {
 protected:
  // 40 steps straight vs stopped at 20 (a preemption notice injected at step 20) and
  // resumed: identical losses at every step and bitwise-identical final weights and
  // optimizer state.
  void expect_exact_resume(const std::string& launcher, const std::string& sets) {
    const std::string cfg = tiny_gpt_config(0.1, 40);
    const std::string base = launcher + LEANTRAIN_BINARY + " train --config " + cfg + " " + sets;
    auto straight = run_cmd(base + " --out " + (dir_ / "straight").string());
    ASSERT_EQ(straight.code, 0) << straight.err;
    auto first = run_cmd("LEANTRAIN_FAULT=sigterm@20 " + base + " --out " + (dir_ / "resumed").string());
    ASSERT_EQ(first.code, 75) << first.err;  // preempted: checkpoint written, exit 75
    EXPECT_TRUE(fs::exists(ck(dir_ / "resumed", 20))) << first.err;
    EXPECT_FALSE(fs::exists(ck(dir_ / "resumed", 40)));
    auto second = run_cmd(base + " --out " + (dir_ / "resumed").string() + " --resume auto");
    ASSERT_EQ(second.code, 0) << second.err;
    EXPECT_NE(second.err.find("resumed from"), std::string::npos) << second.err;
    const auto [a, ea] = losses_of(dir_ / "straight");
    const auto [b, eb] = losses_of(dir_ / "resumed");
    ASSERT_EQ(a.size(), 40u);
    ASSERT_EQ(b.size(), 40u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "step " << i + 1;
    EXPECT_EQ(ea, eb);
    auto cmp = compare_checkpoints(ck(dir_ / "straight", 40), ck(dir_ / "resumed", 40), 0.0, "model,optimizer");
    EXPECT_EQ(cmp.code, 0) << cmp.out << cmp.err;
  }
};

TEST_F(Resume, ExactResumeFp32) { expect_exact_resume("", "--set train.micro_batch=8"); }

TEST_F(Resume, ExactResumeBf16) {
  expect_exact_resume("", "--set train.micro_batch=8 --set precision.mode=bf16");
}

TEST_F(Resume, ExactResumeFp16WithLossScaler) {
  expect_exact_resume("", "--set train.micro_batch=8 --set precision.mode=fp16 --set precision.growth_interval=5");
}

TEST_F(Resume, ExactResumeTwoRanks) { expect_exact_resume(mpirun(2), "--set train.micro_batch=4"); }

TEST_F(Resume, ExactResumeTwoRanksBf16) {
  expect_exact_resume(mpirun(2), "--set train.micro_batch=4 --set precision.mode=bf16");
}

// checkpoint.at_end = false (the peer bench's runs): no checkpoint after the last step, while
// periodic checkpoints and a preemption's checkpoint are still written.
TEST_F(Resume, AtEndFalseSkipsOnlyTheFinalCheckpoint) {
  const std::string cfg = tiny_gpt_config(0.0, 5);
  const std::string base = std::string(LEANTRAIN_BINARY) + " train --config " + cfg +
                           " --set train.micro_batch=8 --set checkpoint.at_end=false";
  auto plain = run_cmd(base + " --out " + (dir_ / "plain").string());
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(losses_of(dir_ / "plain").first.size(), 5u);
  for (int s = 1; s <= 5; ++s) EXPECT_FALSE(fs::exists(ck(dir_ / "plain", s))) << s;
  auto periodic = run_cmd(base + " --set checkpoint.every_steps=2 --out " + (dir_ / "periodic").string());
  ASSERT_EQ(periodic.code, 0) << periodic.err;
  EXPECT_TRUE(fs::exists(ck(dir_ / "periodic", 2)));
  EXPECT_TRUE(fs::exists(ck(dir_ / "periodic", 4)));
  EXPECT_FALSE(fs::exists(ck(dir_ / "periodic", 5)));
  auto preempted = run_cmd("LEANTRAIN_FAULT=sigterm@3 " + base + " --out " + (dir_ / "preempted").string());
  ASSERT_EQ(preempted.code, 75) << preempted.err;
  EXPECT_TRUE(fs::exists(ck(dir_ / "preempted", 3))) << preempted.err;
  auto bad = run_cmd(std::string(LEANTRAIN_BINARY) + " train --config " + cfg +
                     " --set checkpoint.at_end=maybe --out " + (dir_ / "bad").string());
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("checkpoint.at_end"), std::string::npos) << bad.err;
}

// A checkpoint from 2 ranks resumes on 1 (and from 1 on 2) with the same global batch
// (accumulation recomputed) and tracks the uninterrupted 2-rank run (fp32, dropout 0).
TEST_F(Resume, AnotherWorldSizeTracksTheUninterruptedRun) {
  const std::string cfg = tiny_gpt_config(0.0, 20);
  const std::string train = std::string(LEANTRAIN_BINARY) + " train --config " + cfg + " --set train.micro_batch=4 ";
  auto two = run_cmd(mpirun(2) + train + "--out " + (dir_ / "two").string());
  ASSERT_EQ(two.code, 0) << two.err;
  const auto [ref, eref] = losses_of(dir_ / "two");
  ASSERT_EQ(ref.size(), 20u);

  // 2 -> 1
  auto a = run_cmd("LEANTRAIN_FAULT=sigterm@10 " + mpirun(2) + train + "--out " + (dir_ / "a").string());
  ASSERT_EQ(a.code, 75) << a.err;
  auto a2 = run_cmd(train + "--out " + (dir_ / "a").string() + " --resume auto");
  ASSERT_EQ(a2.code, 0) << a2.err;
  EXPECT_NE(a2.err.find("written by 2 ranks"), std::string::npos) << a2.err;
  // 1 -> 2
  auto b = run_cmd("LEANTRAIN_FAULT=sigterm@10 " + train + "--out " + (dir_ / "b").string());
  ASSERT_EQ(b.code, 75) << b.err;
  auto b2 = run_cmd(mpirun(2) + train + "--out " + (dir_ / "b").string() + " --resume auto");
  ASSERT_EQ(b2.code, 0) << b2.err;

  for (const auto& run : {"a", "b"}) {
    const auto [l, e] = losses_of(dir_ / run);
    ASSERT_EQ(l.size(), 20u) << run;
    for (size_t i = 0; i < l.size(); ++i) EXPECT_NEAR(l[i], ref[i], 1e-4 * std::abs(ref[i])) << run << " step " << i + 1;
    EXPECT_NEAR(e, eref, 1e-4 * std::abs(eref)) << run;
  }
}

TEST_F(Resume, GlobalBatchMustMatchTheCheckpoint) {
  const std::string cfg = tiny_gpt_config(0.0, 4);
  ASSERT_EQ(run("train --config " + cfg + " --out " + (dir_ / "r").string()).code, 0);
  auto r = run("train --config " + cfg + " --set train.global_batch=32 --set train.steps=8 --out " +
               (dir_ / "r").string() + " --resume auto");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--set train.global_batch=16"), std::string::npos) << r.err;
}

// SIGTERM from outside (as a scheduler sends it): the run finishes its step, writes a
// checkpoint, exits 75; the checkpoint resumes to the end. The test is the process's parent
// (posix_spawn, no shell), so it reads the exit status itself with waitpid.
TEST_F(Resume, SigtermWritesACheckpointAndExits75) {
  const std::string cfg = tiny_gpt_config(0.0, 100000);
  const auto out = dir_ / "run";
  const auto log_path = dir_ / "log";
  const std::string binary = LEANTRAIN_BINARY;
  std::vector<std::string> args = {binary, "train", "--config", cfg, "--out", out.string()};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  ASSERT_EQ(::posix_spawn_file_actions_init(&actions), 0);
  ::posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ::posix_spawn_file_actions_adddup2(&actions, 1, 2);
  pid_t pid = -1;
  const int spawned = ::posix_spawn(&pid, binary.c_str(), &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  ASSERT_EQ(spawned, 0) << "posix_spawn " << binary << ": " << std::strerror(spawned);

  // Reaps the child; on any early return (a failed ASSERT) it is killed first, so no run of
  // 100000 steps outlives the test.
  int status = 0;
  bool reaped = false;
  auto try_reap = [&] {
    if (!reaped && ::waitpid(pid, &status, WNOHANG) == pid) reaped = true;
    return reaped;
  };
  struct KillOnExit {
    std::function<void()> fn;
    ~KillOnExit() { fn(); }
  } guard{[&] {
    if (!reaped) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      reaped = true;
    }
  }};

  // Wait for a few steps to be logged (bounded); the process must still be running.
  for (int i = 0; i < 600 && complete_step_lines(out) < 3 && !try_reap(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_FALSE(reaped) << "leantrain exited before SIGTERM (status " << status << "):\n" << slurp(log_path);
  ASSERT_GE(complete_step_lines(out), 3u) << slurp(log_path);
  ASSERT_EQ(::kill(pid, SIGTERM), 0);

  // Bounded wait for the exit: a run that ignores SIGTERM is killed and the test fails.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!try_reap() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(reaped) << "leantrain did not exit within 60 s of SIGTERM (killed):\n" << slurp(log_path);
  const std::string log = slurp(log_path);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : -1) << "\n"
                                 << log;
  EXPECT_EQ(WEXITSTATUS(status), 75) << log;
  EXPECT_NE(log.find("preempted by signal 15"), std::string::npos) << log;
  const auto steps = losses_of(out).first.size();
  EXPECT_TRUE(fs::exists(ck(out, static_cast<int>(steps)))) << log;
  auto r = run("train --config " + cfg + " --set train.steps=" + std::to_string(steps + 2) + " --out " +
               out.string() + " --resume auto");
  // The step count changed, which the resume allows (the schedule follows the new total).
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses_of(out).first.size(), steps + 2);
}

TEST_F(Resume, AutoFallsBackPastADamagedNewestCheckpoint) {
  const std::string cfg = tiny_gpt_config(0.0, 6, "[checkpoint]\nevery_steps = 2\nkeep_last = 3\n");
  const auto out = dir_ / "run";
  ASSERT_EQ(run("train --config " + cfg + " --out " + out.string()).code, 0);
  EXPECT_FALSE(fs::exists(ck(out, 0)));
  EXPECT_TRUE(fs::exists(ck(out, 2)));
  EXPECT_TRUE(fs::exists(ck(out, 6)));
  EXPECT_EQ(slurp(out / "checkpoints" / "latest"), "step-00000006.h5\n");
  fs::resize_file(ck(out, 6), fs::file_size(ck(out, 6)) / 2);  // truncated
  auto r = run("train --config " + cfg + " --set train.steps=8 --out " + out.string() + " --resume auto");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("skipping damaged checkpoint"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("resumed from " + ck(out, 4)), std::string::npos) << r.err;
}

TEST_F(Resume, ExplicitPathAndInspect) {
  const std::string cfg = tiny_gpt_config(0.0, 4);
  const auto out = dir_ / "run";
  ASSERT_EQ(run("train --config " + cfg + " --out " + out.string()).code, 0);
  auto r = run("inspect " + ck(out, 4) + " --json");
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["step"], 4);
  EXPECT_EQ(j["global_batch"], 16);
  EXPECT_EQ(j["format_version"], 1);
  EXPECT_EQ(j["model_config"]["kind"], "gpt");
  bool found = false;
  for (const auto& t : j["model"])
    if (t["name"] == "blocks.0.attn.qkv.weight") found = t["shape"] == nlohmann::json::array({96, 32});
  EXPECT_TRUE(found) << r.out;
  r = run("inspect " + ck(out, 4));
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("step 4"), std::string::npos) << r.out;
  r = run("train --config " + cfg + " --set train.steps=6 --out " + (dir_ / "other").string() + " --resume " + ck(out, 4));
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(losses_of(dir_ / "other").first.size(), 2u);  // steps 5 and 6
}

// Fine-tuning: weights only; a new head of another shape is skipped (and listed) on request.
TEST_F(Resume, InitFromSkipsMismatchedTensorsOnlyWhenAsked) {
  const auto out = dir_ / "run";
  ASSERT_EQ(run("train --config " + tiny_gpt_config(0.0, 2) + " --out " + out.string()).code, 0);
  const std::string other = tiny_gpt_config(0.0, 3, "");
  auto r = run("train --config " + other + " --set model.seq_len=16 --out " + (dir_ / "ft").string() +
               " --init-from " + ck(out, 2));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("wpe"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("[32, 32] in the checkpoint, [16, 32] in the model"), std::string::npos) << r.err;
  r = run("train --config " + other + " --set model.seq_len=16 --out " + (dir_ / "ft").string() + " --init-from " +
          ck(out, 2) + " --init-skip-mismatched");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("skipped 1 with another shape"), std::string::npos) << r.err;
  EXPECT_EQ(losses_of(dir_ / "ft").first.size(), 3u);  // step 0 onward: fresh optimizer and schedule
}

// Every damaged-file case is one clear error (exit 2) naming the file and the problem.
TEST_F(Resume, DamagedCheckpointsAreClearErrors) {
  const std::string cfg = tiny_gpt_config(0.0, 2);
  const auto out = dir_ / "run";
  ASSERT_EQ(run("train --config " + cfg + " --out " + out.string()).code, 0);
  const std::string good = ck(out, 2);
  auto expect_error = [&](const std::string& file, const std::string& needle) {
    auto r = run("inspect " + file);
    EXPECT_EQ(r.code, 2) << file << ": " << r.out << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    r = run("train --config " + cfg + " --set train.steps=4 --out " + (dir_ / "x").string() + " --resume " + file);
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir_ / "x" / "checkpoints")) << "a failed resume wrote a checkpoint";
  };
  expect_error((dir_ / "missing.h5").string(), "no such checkpoint file");
  // Truncated.
  fs::copy_file(good, dir_ / "trunc.h5");
  fs::resize_file(dir_ / "trunc.h5", fs::file_size(good) - 1000);
  expect_error((dir_ / "trunc.h5").string(), "trunc.h5");
  // Not HDF5 at all.
  std::ofstream(dir_ / "text.h5") << "hello";
  expect_error((dir_ / "text.h5").string(), "not an HDF5 file");
  // A flipped byte inside a tensor's data: locate the data of the largest tensor by its
  // bytes (the token embedding) through h5py's offset, flip one byte.
  fs::copy_file(good, dir_ / "flip.h5");
  auto off = run_cmd(std::string(LEANTRAIN_SOURCE_DIR) + "/.venv/bin/python -c \"import h5py;" +
                     "print(h5py.File('" + good + "')['model/wte.weight'].id.get_offset())\"");
  ASSERT_EQ(off.code, 0) << off.err;
  {
    std::fstream f(dir_ / "flip.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(std::stoll(off.out) + 100);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(std::stoll(off.out) + 100);
    f.write(&c, 1);
  }
  expect_error((dir_ / "flip.h5").string(), "wte.weight is corrupt (checksum mismatch)");
  // A flipped byte in the metadata (the superblock area): caught by HDF5's checksums.
  fs::copy_file(good, dir_ / "meta.h5");
  {
    std::fstream f(dir_ / "meta.h5", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    char c = 0x5a;
    f.write(&c, 1);
  }
  expect_error((dir_ / "meta.h5").string(), "meta.h5");
  // A future format version.
  fs::copy_file(good, dir_ / "future.h5");
  auto v = run_cmd(std::string(LEANTRAIN_SOURCE_DIR) + "/.venv/bin/python -c \"import h5py;" +
                   "f=h5py.File('" + (dir_ / "future.h5").string() + "','r+');f.attrs['format_version']=2\"");
  ASSERT_EQ(v.code, 0) << v.err;
  expect_error((dir_ / "future.h5").string(), "format version 2 is newer");
  // A checkpoint of another model: every mismatch listed.
  const auto other = dir_ / "other";
  ASSERT_EQ(run("train --config " + tiny_gpt_config(0.0, 1) + " --set model.n_layer=1 --set model.d_model=16 --out " +
                other.string()).code, 0);
  auto r = run("train --config " + cfg + " --set train.steps=4 --out " + (dir_ / "y").string() + " --resume " +
               ck(other, 1));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("does not match the model"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("missing blocks.1.attn.qkv.weight"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("wte.weight: shape [64, 16] in the checkpoint, [64, 32] in the model"), std::string::npos)
      << r.err;
}

}  // namespace
