#include "leantrain/runtime/memory_meter.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <unordered_map>

#ifdef LEANTRAIN_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace lt {
namespace {

// Note [CPU tracking allocator]
// LibTorch has no CPU peak counter. We wrap the allocator that was current at install time.
// Some callers use raw_allocate(), which requires data == context, so the DataPtr we return
// has the data pointer as its context and a side table maps it to the inner DataPtr (which
// owns the real free) and the size. Allocations by oneDNN's private scratchpads bypass c10
// and are not seen.
class TrackingCPUAllocator final : public c10::Allocator {
 public:
  explicit TrackingCPUAllocator(c10::Allocator* inner) : inner_(inner) {}

  c10::DataPtr allocate(size_t nbytes) override {
    // Note [CPU memory budget]: the budget is checked before the real allocation, against the
    // tracked current bytes, and refused with the error the CUDA caching allocator throws
    // (c10::OutOfMemoryError), so out-of-memory handling and the planner run the same code
    // on the CPU as on a GPU. Two threads allocating at once may both pass the check by a
    // few bytes; training allocates from one thread.
    const int64_t budget = budget_.load();
    if (budget > 0 && nbytes > 0) {
      const int64_t cur = current_.load();
      TORCH_CHECK_WITH(OutOfMemoryError, cur + static_cast<int64_t>(nbytes) <= budget,
                       "CPU out of memory: tried to allocate ", format_bytes(static_cast<int64_t>(nbytes)),
                       " with ", format_bytes(cur), " allocated, past the memory budget of ",
                       format_bytes(budget), " (memory.budget / --memory-budget)");
    }
    c10::DataPtr inner = inner_->allocate(nbytes);
    void* data = inner.get();
    if (data == nullptr) return inner;  // zero-byte allocations carry no memory
    {
      std::lock_guard<std::mutex> lock(mu_);
      live_.emplace(data, Entry{std::move(inner), static_cast<int64_t>(nbytes)});
    }
    const int64_t now = current_.fetch_add(static_cast<int64_t>(nbytes)) + static_cast<int64_t>(nbytes);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &TrackingCPUAllocator::free_ptr, c10::Device(c10::DeviceType::CPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override { return &TrackingCPUAllocator::free_ptr; }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

  MemoryStats stats() const { return {current_.load(), peak_.load()}; }
  void reset_peak() { peak_.store(current_.load()); }
  void set_budget(int64_t bytes) { budget_.store(bytes); }
  int64_t budget() const { return budget_.load(); }

 private:
  struct Entry {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void free_ptr(void* p);

  c10::Allocator* inner_;
  std::mutex mu_;
  std::unordered_map<void*, Entry> live_;
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> budget_{0};
};

TrackingCPUAllocator* tracker() {
  // Lives for the whole process: tensors freed during static destruction still call into it.
  static TrackingCPUAllocator* t = [] {
    auto* a = new TrackingCPUAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(a, /*priority=*/100);
    return a;
  }();
  return t;
}

void TrackingCPUAllocator::free_ptr(void* p) {
  TrackingCPUAllocator* self = tracker();
  c10::DataPtr inner;  // freed when it goes out of scope, outside the lock
  {
    std::lock_guard<std::mutex> lock(self->mu_);
    auto it = self->live_.find(p);
    if (it == self->live_.end()) return;
    inner = std::move(it->second.inner);
    self->current_.fetch_sub(it->second.bytes);
    self->live_.erase(it);
  }
}

}  // namespace

MemoryMeter::MemoryMeter(int device_index) : device_(device_index) {
  if (device_ < 0) install_cpu_tracking();
}

void MemoryMeter::install_cpu_tracking() { tracker(); }

MemoryStats MemoryMeter::stats() const {
#ifdef LEANTRAIN_TORCH_CUDA
  if (device_ >= 0) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device_));
    const auto& a = s.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    return {a.current, a.peak};
  }
#endif
  return tracker()->stats();
}

void MemoryMeter::reset_peak() {
#ifdef LEANTRAIN_TORCH_CUDA
  if (device_ >= 0) {
    c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device_));
    return;
  }
#endif
  tracker()->reset_peak();
}

void MemoryMeter::set_budget(int64_t bytes) {
  if (bytes < 0) bytes = 0;
#ifdef LEANTRAIN_TORCH_CUDA
  if (device_ >= 0) {
    // The caching allocator refuses (OutOfMemoryError) an allocation that would take its
    // reserved memory past fraction x total; fraction 1 lifts the limit.
    const auto dev = static_cast<c10::DeviceIndex>(device_);
    c10::cuda::CUDAGuard guard(dev);
    size_t free_bytes = 0, total_bytes = 0;
    C10_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double fraction =
        bytes == 0 ? 1.0 : std::min(1.0, static_cast<double>(bytes) / static_cast<double>(total_bytes));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, dev);
    cuda_budget_ = bytes;
    return;
  }
#endif
  tracker()->set_budget(bytes);
}

int64_t MemoryMeter::budget() const {
#ifdef LEANTRAIN_TORCH_CUDA
  if (device_ >= 0) return cuda_budget_;
#endif
  return tracker()->budget();
}

std::string MemoryMeter::device_name() const {
  return device_ < 0 ? "cpu" : "cuda:" + std::to_string(device_);
}

std::string format_bytes(int64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace lt
