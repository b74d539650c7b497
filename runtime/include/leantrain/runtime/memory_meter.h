#pragma once
// Peak-memory measurement with one API for both devices: on CUDA the caching allocator's
// statistics, on the CPU a tracking allocator installed under LibTorch (c10::SetCPUAllocator)
// that counts every tensor allocation. Peaks are resettable so each phase (a step, an
// epoch, a planner probe) measures its own. A budget makes the device's memory a hard limit.
#include <cstdint>
#include <string>

namespace lt {

struct MemoryStats {
  int64_t current_bytes = 0;
  int64_t peak_bytes = 0;
};

class MemoryMeter {
 public:
  /// device_index < 0 means the CPU. Installs the CPU tracking allocator on first use.
  explicit MemoryMeter(int device_index = -1);

  MemoryStats stats() const;
  void reset_peak();
  std::string device_name() const;

  /// A hard per-device limit (0: none). On the CPU the tracking allocator refuses an
  /// allocation that would take the tracked current bytes past it; on CUDA the caching
  /// allocator's memory fraction is set to budget / total. Either way the refusal is a
  /// c10::OutOfMemoryError, the error a full GPU raises. Process-wide: it stays until reset.
  void set_budget(int64_t bytes);
  int64_t budget() const;

  /// Installs the tracking CPU allocator (idempotent, thread-safe). Tensors allocated
  /// before the call are not counted.
  static void install_cpu_tracking();

 private:
  int device_;
  int64_t cuda_budget_ = 0;
};

/// "1.50 GiB" style rendering for logs.
std::string format_bytes(int64_t bytes);

}  // namespace lt
