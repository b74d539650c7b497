#pragma once
// Peak-memory measurement with one API for both devices: on CUDA the caching allocator's
// statistics, on the CPU a tracking allocator installed under LibTorch (c10::SetCPUAllocator)
// that counts every tensor allocation. Peaks are resettable so each phase (a step, an
// epoch, a planner probe) measures its own.
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

  /// Installs the tracking CPU allocator (idempotent, thread-safe). Tensors allocated
  /// before the call are not counted.
  static void install_cpu_tracking();

 private:
  int device_;
};

/// "1.50 GiB" style rendering for logs.
std::string format_bytes(int64_t bytes);

}  // namespace lt
