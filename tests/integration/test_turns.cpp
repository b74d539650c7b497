// LEANTRAIN_BENCH_TURNS (Note [Taking turns], trainers/turns.h) end to end: the trainer takes
// exactly one step per turn it is given, waits for an exit turn before it ends, goes on
// without turns when the harness goes away, and refuses a malformed value by name.
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <thread>

#include "cli_fixture.h"

namespace {

class Turns : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    go_path_ = (dir_ / "go").string();
    done_path_ = (dir_ / "done").string();
    ASSERT_EQ(::mkfifo(go_path_.c_str(), 0600), 0);
    ASSERT_EQ(::mkfifo(done_path_.c_str(), 0600), 0);
    // Held read-write, as bench/peers/compare.py does, so the trainer's opens never block; close
    // on exec, or the trainer would hold a writer of GO itself and never see the harness go.
    go_ = ::open(go_path_.c_str(), O_RDWR | O_CLOEXEC);
    done_ = ::open(done_path_.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(go_, 0);
    ASSERT_GE(done_, 0);
  }
  void TearDown() override {
    close_harness();  // a failed assertion mid-run: the trainer goes on without turns and ends
    if (trainer_.joinable()) trainer_.join();
    Cli::TearDown();
  }
  void close_harness() {
    if (go_ >= 0) ::close(go_);
    if (done_ >= 0) ::close(done_);
    go_ = done_ = -1;
  }
  // The trainer in a thread of its own (3 steps of the tiny GPT); the test is the harness.
  void start(int steps) {
    const std::string cmd = "LEANTRAIN_BENCH_TURNS=" + go_path_ + ":" + done_path_ + " " + LEANTRAIN_BINARY +
                            " train --config " + tiny_gpt_config(0.0, steps) + " --out " + (dir_ / "run").string();
    trainer_ = std::thread([this, cmd] { result_ = run_cmd(cmd); });
  }
  Result finish() {
    trainer_.join();
    return result_;
  }
  void grant() { ASSERT_EQ(::write(go_, "g", 1), 1); }
  // True when the trainer hands the turn back within `ms`.
  bool turn_ended(int ms) {
    pollfd p{done_, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    char c;
    return ::read(done_, &c, 1) == 1;
  }
  size_t steps_logged() { return events(dir_ / "run", "step").size(); }

  std::string go_path_, done_path_;
  int go_ = -1, done_ = -1;
  std::thread trainer_;
  Result result_;
};

TEST_F(Turns, OneStepPerTurnAndAnExitTurn) {
  start(3);
  // Without a turn nothing is trained (startup may take a while: wait generously, then check).
  EXPECT_FALSE(turn_ended(3000));
  EXPECT_EQ(steps_logged(), 0u);
  for (size_t k = 1; k <= 3; ++k) {
    grant();
    ASSERT_TRUE(turn_ended(120000)) << "turn " << k;
    // The turn is over: the trainer waits, it does not run ahead.
    EXPECT_FALSE(turn_ended(500));
    EXPECT_EQ(steps_logged(), k);
  }
  // All steps done, the final evaluation was part of the last turn; the process waits for its
  // exit turn and then ends well.
  EXPECT_EQ(events(dir_ / "run", "epoch").size(), 1u);
  grant();
  auto r = finish();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(steps_logged(), 3u);
}

TEST_F(Turns, AVanishedHarnessLeavesNoHang) {
  start(4);
  grant();
  ASSERT_TRUE(turn_ended(120000));
  close_harness();  // end of file on GO, no reader of DONE
  auto r = finish();
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(steps_logged(), 4u);
  EXPECT_NE(r.err.find("the harness went away"), std::string::npos) << r.err;
}

TEST_F(Turns, AMalformedValueIsRefusedByName) {
  auto r = run_cmd("LEANTRAIN_BENCH_TURNS=only-one-path " + std::string(LEANTRAIN_BINARY) + " train --config " +
                   tiny_gpt_config(0.0, 2) + " --out " + (dir_ / "bad").string());
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("LEANTRAIN_BENCH_TURNS = 'only-one-path'"), std::string::npos) << r.err;
  EXPECT_EQ(events(dir_ / "bad", "step").size(), 0u);
}

}  // namespace
