// AbortOnce (comm/src/abort_once.h), the owner of the NCCL communicator's lifetime (Note
// [NCCL communicator lifetime]), on the CPU with threads racing: exactly one end, no use
// after the end has begun, an end that waits for the call in flight and one that does not
// wait for a call blocked forever. A fake handle stands in for the ncclComm_t: a Resource
// that counts its ends and fails the test when used after one.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "../../comm/src/abort_once.h"

namespace {

using lt::comm::AbortOnce;
using namespace std::chrono_literals;

struct Resource {
  std::atomic<int> ends{0};
  std::atomic<bool> ended{false};
  std::atomic<int> used_after_end{0};
  std::atomic<int64_t> uses{0};

  void use() {
    if (ended.load()) ++used_after_end;
    ++uses;
  }
  void end() {
    ended = true;
    ++ends;
  }
};

using Owner = AbortOnce<Resource*>;

TEST(AbortOnce, StartsRunningAndEndsOnce) {
  Resource r;
  Owner life;
  EXPECT_TRUE(life.usable());
  EXPECT_FALSE(life.use([](Resource*) { FAIL() << "used before a handle was published"; }));
  ASSERT_TRUE(life.publish(&r));
  EXPECT_TRUE(life.use([](Resource* h) { h->use(); }));
  EXPECT_TRUE(life.try_use([](Resource* h) { h->use(); }));
  EXPECT_TRUE(life.end_once([](Resource* h) { h->end(); }));
  EXPECT_EQ(life.state(), Owner::State::kAborted);
  EXPECT_FALSE(life.usable());
  EXPECT_FALSE(life.end_once([](Resource* h) { h->end(); }));
  EXPECT_FALSE(life.use([](Resource* h) { h->use(); }));
  EXPECT_FALSE(life.try_use([](Resource* h) { h->use(); }));
  EXPECT_FALSE(life.publish(&r));
  EXPECT_EQ(r.ends.load(), 1);
  EXPECT_EQ(r.uses.load(), 2);
  EXPECT_EQ(r.used_after_end.load(), 0);
}

// An error before the handle exists (ncclGetUniqueId, ncclCommInitRank failing) ends the
// life with no handle; a handle made later (the init returning after the watchdog's abort)
// is refused: the caller must not use it.
TEST(AbortOnce, EndBeforePublishRunsWithNoHandleAndRefusesALaterOne) {
  Owner life;
  Resource* seen = reinterpret_cast<Resource*>(1);
  EXPECT_TRUE(life.end_once([&](Resource* h) { seen = h; }));
  EXPECT_EQ(seen, nullptr);
  Resource r;
  EXPECT_FALSE(life.publish(&r));
  EXPECT_FALSE(life.use([](Resource* h) { h->use(); }));
  EXPECT_EQ(r.uses.load(), 0);
}

// The watchdog (fail()), the caller's nccl_check and NcclCommunicator::abort racing: over
// many rounds, exactly one of them ends the handle, once, and every other returns false
// without running its end.
TEST(AbortOnce, RacingEndersEndExactlyOnce) {
  constexpr int kRounds = 1000, kThreads = 4;
  for (int round = 0; round < kRounds; ++round) {
    Resource r;
    Owner life;
    ASSERT_TRUE(life.publish(&r));
    std::atomic<int> winners{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
      threads.emplace_back([&] {
        while (!go.load()) std::this_thread::yield();
        if (life.end_once([](Resource* h) { h->end(); })) ++winners;
      });
    go = true;
    for (auto& t : threads) t.join();
    ASSERT_EQ(winners.load(), 1) << "round " << round;
    ASSERT_EQ(r.ends.load(), 1) << "round " << round;
    ASSERT_EQ(life.state(), Owner::State::kAborted);
  }
}

// The watchdog polling (try_use, as ncclCommGetAsyncError) and the collective thread using
// (use, as the enqueue) while another thread ends the handle: no use ever sees it ended.
TEST(AbortOnce, NoUseOnceTheEndHasBegun) {
  constexpr int kRounds = 300;
  for (int round = 0; round < kRounds; ++round) {
    Resource r;
    Owner life;
    ASSERT_TRUE(life.publish(&r));
    std::atomic<bool> stop{false};
    auto user = [&](bool polling) {
      while (!stop.load()) {
        auto f = [](Resource* h) { h->use(); };
        if (!(polling ? life.try_use(f) : life.use(f)) && !life.usable()) return;
      }
    };
    std::thread watchdog(user, true), collectives(user, false);
    while (r.uses.load() < 50) std::this_thread::yield();  // both are at it
    std::thread ender([&] { EXPECT_TRUE(life.end_once([](Resource* h) { h->end(); })); });
    ender.join();
    stop = true;
    watchdog.join();
    collectives.join();
    ASSERT_EQ(r.used_after_end.load(), 0) << "round " << round;
    ASSERT_EQ(r.ends.load(), 1);
    ASSERT_FALSE(life.use([](Resource* h) { h->use(); }));
  }
}

// An enqueue in flight (holding the lock for a while, as NCCL does when it connects two
// ranks) is waited for: the end runs after it returned, not under it.
TEST(AbortOnce, EndWaitsForTheCallInFlight) {
  Resource r;
  Owner life;
  ASSERT_TRUE(life.publish(&r));
  std::atomic<bool> inside{false}, left{false};
  std::thread collectives([&] {
    life.use([&](Resource* h) {
      inside = true;
      std::this_thread::sleep_for(200ms);
      h->use();
      left = true;
    });
  });
  while (!inside.load()) std::this_thread::yield();
  // The watchdog cannot poll meanwhile (it would wait behind a blocked call): try_use gives up.
  EXPECT_FALSE(life.try_use([](Resource* h) { h->use(); }));
  bool left_before_end = false;
  EXPECT_TRUE(life.end_once([&](Resource* h) {
    left_before_end = left.load();
    h->end();
  }, 5000ms));
  collectives.join();
  EXPECT_TRUE(left_before_end);
  EXPECT_EQ(r.used_after_end.load(), 0);
  EXPECT_EQ(r.ends.load(), 1);
}

// A call blocked on a peer that never comes is not waited for past the grace: the end (the
// abort) runs under it and is what releases it; afterwards the handle is not used again.
TEST(AbortOnce, EndDoesNotWaitForeverForABlockedCall) {
  Resource r;
  Owner life;
  ASSERT_TRUE(life.publish(&r));
  std::atomic<bool> inside{false};
  std::thread collectives([&] {
    life.use([&](Resource* h) {
      inside = true;
      while (!h->ended.load()) std::this_thread::sleep_for(1ms);  // released by the abort only
    });
    EXPECT_FALSE(life.use([](Resource* h) { h->use(); }));  // back from NCCL: ended
  });
  while (!inside.load()) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(life.end_once([](Resource* h) { h->end(); }, 100ms));
  const auto waited = std::chrono::steady_clock::now() - t0;
  collectives.join();
  EXPECT_GE(waited, 90ms);
  EXPECT_LT(waited, 5s);
  EXPECT_EQ(r.ends.load(), 1);
  EXPECT_EQ(r.used_after_end.load(), 0);
  EXPECT_EQ(life.state(), Owner::State::kAborted);
}

// While the first ender waits for the call in flight, a second ender (the main thread's
// nccl_check while the watchdog's fail() aborts) returns false at once: it never waits for
// the first, which may be joining its thread.
TEST(AbortOnce, SecondEnderDoesNotWait) {
  Resource r;
  Owner life;
  ASSERT_TRUE(life.publish(&r));
  std::atomic<bool> inside{false}, release{false};
  std::thread collectives([&] {
    life.use([&](Resource*) {
      inside = true;
      while (!release.load()) std::this_thread::sleep_for(1ms);
    });
  });
  while (!inside.load()) std::this_thread::yield();
  std::thread first([&] { EXPECT_TRUE(life.end_once([](Resource* h) { h->end(); }, 10000ms)); });
  while (life.state() == Owner::State::kRunning) std::this_thread::yield();
  EXPECT_EQ(life.state(), Owner::State::kAborting);
  EXPECT_FALSE(life.usable());
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_FALSE(life.end_once([](Resource* h) { h->end(); }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  release = true;
  collectives.join();
  first.join();
  EXPECT_EQ(r.ends.load(), 1);
}

}  // namespace
