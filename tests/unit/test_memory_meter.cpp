// The peak-memory meter on the CPU: the tracking allocator sees tensor allocations.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "leantrain/runtime/memory_meter.h"

namespace {

TEST(MemoryMeter, HundredMegabyteAllocationRaisesPeakAndResetWorks) {
  lt::MemoryMeter meter(-1);
  meter.reset_peak();
  const auto before = meter.stats();
  {
    auto t = torch::empty({100 * 1000 * 1000}, torch::kUInt8);
    const auto during = meter.stats();
    EXPECT_GE(during.current_bytes - before.current_bytes, 100'000'000);
  }
  const auto after = meter.stats();
  EXPECT_GE(after.peak_bytes - before.current_bytes, 100'000'000);
  EXPECT_LT(after.current_bytes - before.current_bytes, 1'000'000);  // freed
  meter.reset_peak();
  EXPECT_LT(meter.stats().peak_bytes - before.current_bytes, 1'000'000);
}

TEST(MemoryMeter, CountsIntermediatesOfComputation) {
  lt::MemoryMeter meter(-1);
  auto a = torch::randn({512, 512});
  meter.reset_peak();
  const auto base = meter.stats().current_bytes;
  { auto c = torch::matmul(a, a) + 1; }  // two 1 MiB results live at once
  EXPECT_GE(meter.stats().peak_bytes - base, 2 * 512 * 512 * 4);
}

TEST(MemoryMeter, BudgetRefusesAnAllocationPastItWithTheOutOfMemoryErrorOfAGpu) {
  lt::MemoryMeter meter(-1);
  const auto base = meter.stats().current_bytes;
  meter.set_budget(base + 10'000'000);
  EXPECT_EQ(meter.budget(), base + 10'000'000);
  { auto fits = torch::empty({8'000'000}, torch::kUInt8); }  // 8 MB under a 10 MB headroom
  auto held = torch::empty({6'000'000}, torch::kUInt8);
  bool refused = false;
  try {
    auto too_much = torch::empty({6'000'000}, torch::kUInt8);  // 12 MB together
  } catch (const c10::OutOfMemoryError& e) {
    refused = true;
    EXPECT_NE(std::string(e.what_without_backtrace()).find("memory budget"), std::string::npos);
  }
  EXPECT_TRUE(refused);
  EXPECT_LT(meter.stats().current_bytes - base, 7'000'000);  // the refused bytes were never counted
  meter.set_budget(0);                                          // lifted
  auto now_fits = torch::empty({6'000'000}, torch::kUInt8);
  EXPECT_GE(meter.stats().current_bytes - base, 12'000'000);
}

TEST(MemoryMeter, FormatsBytes) {
  EXPECT_EQ(lt::format_bytes(512), "512 B");
  EXPECT_EQ(lt::format_bytes(3LL << 30), "3.00 GiB");
}

}  // namespace
