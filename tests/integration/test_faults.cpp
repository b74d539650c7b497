// Faults end to end (LEANTRAIN_FAULT, trainers/faults.h): a run never hangs and never loses
// work. Non-finite losses, failed and interrupted checkpoint writes, a full disk, and under
// mpirun a killed, a hung and a failing rank — each with its exit code, its message and a
// bound on how long the job takes to end.
#include <sys/mount.h>

#include <chrono>
#include <cstring>

#include "cli_fixture.h"

namespace {

using Clock = std::chrono::steady_clock;

class Faults : public Cli {
 protected:
  // The tiny GPT with a checkpoint every 2 steps (keep all).
  std::string cfg(int steps) {
    return tiny_gpt_config(0.0, steps, "[checkpoint]\nevery_steps = 2\nkeep_last = 10\n");
  }
  std::string train(int steps, const std::string& out, const std::string& more = "") {
    return std::string(LEANTRAIN_BINARY) + " train --config " + cfg(steps) + " --out " + (dir_ / out).string() +
           " " + more;
  }
  Result timed(const std::string& command, double* seconds) {
    const auto t0 = Clock::now();
    auto r = run_cmd(command);
    *seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }
  // Rank 1 SIGKILLs itself at step 3 of 2 ranks under mpirun: non-zero within 15 s.
  void expect_a_killed_rank_ends_the_job(const std::string& more) {
    double s = 0;
    auto r = timed("LEANTRAIN_FAULT=kill@3:1 " + mpirun(2) +
                       train(1000, "run", "--set train.micro_batch=4 --set checkpoint.every_steps=0 --set log.all_ranks=true " + more),
                   &s);
    EXPECT_NE(r.code, 0) << r.err;
    EXPECT_LT(s, 15.0) << r.err;
    EXPECT_NE(r.err.find("fault injection: SIGKILL at step 3 on rank 1"), std::string::npos) << r.err;
  }
};

TEST_F(Faults, NonFiniteLossStopsBeforeTheUpdateByDefault) {
  auto r = run_cmd("LEANTRAIN_FAULT=nan@3 " + train(6, "run"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("training stopped: step 3: the training loss is nan (train.nonfinite = \"stop\")"),
            std::string::npos) << r.err;
  EXPECT_NE(r.err.find("set train.nonfinite = \"skip\""), std::string::npos) << r.err;
  EXPECT_EQ(events(dir_ / "run", "step").size(), 2u);  // step 3 was never logged as trained
  EXPECT_EQ(run("inspect " + ck(dir_ / "run", 2)).code, 0);
}

// bf16, train.nonfinite = "skip": the update of the NaN step is dropped — its checkpoint holds
// exactly the weights and optimizer state of the step before — and the run goes on.
TEST_F(Faults, NonFiniteLossSkipLeavesWeightsUntouched) {
  auto r = run_cmd("LEANTRAIN_FAULT=nan@3 " + train(4, "run",
                   "--set precision.mode=bf16 --set train.nonfinite=skip --set checkpoint.every_steps=1"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto skipped = events(dir_ / "run", "skipped_step");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["step"], 3);
  EXPECT_EQ(skipped[0]["reason"], "non-finite loss");
  auto same = compare_checkpoints(ck(dir_ / "run", 2), ck(dir_ / "run", 3), 0.0, "model,optimizer");
  EXPECT_EQ(same.code, 0) << same.out << same.err;
  auto moved = compare_checkpoints(ck(dir_ / "run", 3), ck(dir_ / "run", 4), 0.0, "model");
  EXPECT_EQ(moved.code, 1) << "step 4 trained again: " << moved.out;
  EXPECT_EQ(events(dir_ / "run", "step").size(), 4u);
}

TEST_F(Faults, NonFiniteLossSkipsAreLimited) {
  auto r = run_cmd("LEANTRAIN_FAULT=nan@2,nan@3 " +
                   train(6, "run", "--set train.nonfinite=skip --set train.nonfinite_max_skips=1"));
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("step 3: the training loss is nan in 2 steps in a row (train.nonfinite_max_skips = 1)"),
            std::string::npos) << r.err;
}

// fp16: the loss scaler owns non-finite values — the step is skipped and the scale backs off.
TEST_F(Faults, Fp16NonFiniteLossIsTheScalersSkip) {
  auto r = run_cmd("LEANTRAIN_FAULT=nan@2 " + train(3, "run", "--set precision.mode=fp16"));
  ASSERT_EQ(r.code, 0) << r.err;
  const auto skipped = events(dir_ / "run", "skipped_step");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0]["reason"], "non-finite gradient");
  EXPECT_EQ(skipped[0]["new_loss_scale"].get<double>(), skipped[0]["loss_scale"].get<double>() * 0.5);
}

// A checkpoint write that fails (as on a full disk): exit 4 naming the file, the earlier
// checkpoint intact and pointed at, no temporary file left, and the run resumes from it.
TEST_F(Faults, FailedCheckpointWriteKeepsEarlierOnesAndResumes) {
  auto r = run_cmd("LEANTRAIN_FAULT=ckpt_fail@4 " + train(6, "run"));
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_NE(r.err.find("storage error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("step-00000004.h5"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("File too large"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the checkpoints written before it in"), std::string::npos) << r.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_ / "run" / "checkpoints")) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000002.h5"}));
  EXPECT_EQ(slurp(dir_ / "run" / "checkpoints" / "latest"), "step-00000002.h5\n");
  EXPECT_EQ(run("inspect " + ck(dir_ / "run", 2)).code, 0);
  auto again = run_cmd(train(6, "run", "--resume auto"));
  EXPECT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("resumed from " + ck(dir_ / "run", 2)), std::string::npos) << again.err;
}

// Killed in the middle of writing a checkpoint: the previous checkpoint is intact, and the
// run resumed from it ends bitwise where an uninterrupted run ends.
TEST_F(Faults, KillDuringCheckpointWriteResumesToTheSameWeights) {
  ASSERT_EQ(run_cmd(train(6, "straight")).code, 0);
  auto r = run_cmd("LEANTRAIN_FAULT=ckpt_kill@4 " + train(6, "run"));
  EXPECT_EQ(r.code, 128 + 9) << r.err;  // SIGKILL, mid-write
  EXPECT_FALSE(fs::exists(ck(dir_ / "run", 4)));
  EXPECT_EQ(slurp(dir_ / "run" / "checkpoints" / "latest"), "step-00000002.h5\n");
  auto again = run_cmd(train(6, "run", "--resume auto"));
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.err.find("resumed from " + ck(dir_ / "run", 2)), std::string::npos) << again.err;
  auto cmp = compare_checkpoints(ck(dir_ / "straight", 6), ck(dir_ / "run", 6), 0.0, "model,optimizer");
  EXPECT_EQ(cmp.code, 0) << cmp.out << cmp.err;
  for (const auto& e : fs::directory_iterator(dir_ / "run" / "checkpoints"))  // the torn file was swept
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// A real full disk: the checkpoint directory on a tmpfs with room for one checkpoint only.
TEST_F(Faults, DiskFullIsAClearErrorAndKeepsTheOldCheckpoint) {
  const auto disk = dir_ / "disk";
  fs::create_directories(disk);
  // One tiny-GPT checkpoint is ~383 KiB; 600 KiB holds one but not two.
  if (::mount("tmpfs", disk.c_str(), "tmpfs", 0, "size=600k") != 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (needs root and mount rights): " << std::strerror(errno);
  struct Unmount {
    std::string p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{disk.string()};
  auto r = run_cmd(train(6, "run", "--set checkpoint.dir=" + disk.string() + " --set checkpoint.keep_last=3"));
  EXPECT_EQ(r.code, 4) << r.err;
  EXPECT_NE(r.err.find("storage error: "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("No space left on device"), std::string::npos) << r.err;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(disk)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"latest", "step-00000002.h5"}));
  auto inspect = run("inspect " + (disk / "step-00000002.h5").string());
  EXPECT_EQ(inspect.code, 0) << inspect.err;
}

TEST_F(Faults, MalformedFaultSpecIsAConfigError) {
  auto r = run_cmd("LEANTRAIN_FAULT=explode@3 " + train(2, "run"));
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("LEANTRAIN_FAULT = 'explode@3'"), std::string::npos) << r.err;
}

// --- under mpirun: 2 ranks ---------------------------------------------------------------

// A rank dies (SIGKILL) mid-run: mpirun ends the whole job, non-zero, within 15 s.
TEST_F(Faults, KilledRankEndsTheJobWithin15s) { expect_a_killed_rank_ends_the_job(""); }

// The same with the optimizer state sharded: the survivor waits in a reduce-scatter or an
// all-gather, not an all-reduce (tests/cluster/shard_kill.sh: on 2 hosts, then resumed).
TEST_F(Faults, KilledRankEndsAShardedJobWithin15s) { expect_a_killed_rank_ends_the_job("--set memory.shard=optimizer"); }

// A rank hangs (alive, never joining the next collective): the survivor's deadline
// (comm.timeout_s = 3 once the first step is done) reports the collective, the step, its rank
// and host, names the rank that did not answer its probe (Note [Who is stuck]), and ends the
// job with exit 3 within the deadline + 10 s.
TEST_F(Faults, HungRankEndsTheJobAtTheDeadline) {
  double s = 0;
  auto r = timed("LEANTRAIN_FAULT=hang@3:1 " + mpirun(2) +
                     train(1000, "run", "--set train.micro_batch=4 --set checkpoint.every_steps=0 --set comm.timeout_s=3 --set log.all_ranks=true"),
                 &s);
  EXPECT_EQ(r.code, 3) << r.err;
  EXPECT_LT(s, 3.0 + 10.0) << r.err;
  EXPECT_NE(r.err.find("at step 3 on rank 0"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("did not complete within 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 did not answer within 2 s (stuck or dead)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("fault injection: hanging at step 3 on rank 1"), std::string::npos) << r.err;
}

// A rank fails with an error the other cannot know of: it reports and ends the job at once
// (not at the 120 s deadline the other rank would otherwise wait for), with its exit code.
TEST_F(Faults, FailingRankEndsTheJobAtOnce) {
  double s = 0;
  auto r = timed("LEANTRAIN_FAULT=throw@3:1 " + mpirun(2) +
                     train(1000, "run", "--set train.micro_batch=4 --set checkpoint.every_steps=0 --set comm.timeout_s=120"),
                 &s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_LT(s, 15.0) << r.err;
  EXPECT_NE(r.err.find("rank 1 on "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("error: fault injection: an error at step 3 on rank 1"), std::string::npos) << r.err;
}

// Non-finite loss on one rank only: the ranks agree (the loss is all-reduced before the
// update) and all stop together, cleanly, with exit 1 — no deadline, no abort.
TEST_F(Faults, NonFiniteLossOnOneRankStopsEveryRankTogether) {
  double s = 0;
  auto r = timed("LEANTRAIN_FAULT=nan@3:1 " + mpirun(2) + train(1000, "run", "--set train.micro_batch=4 --set checkpoint.every_steps=0"), &s);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_LT(s, 15.0) << r.err;
  EXPECT_NE(r.err.find("step 3: the training loss is nan"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("MPI_ABORT"), std::string::npos) << r.err;
}

}  // namespace
