#pragma once
// A few integers computed on the device, read on the host without draining the device's queue
// (Note [Counts read behind the queue] in recompute/src/host_readback.cpp).
#include <cstdint>
#include <memory>
#include <vector>

#include <torch/types.h>

namespace lt::recompute {

class HostReadback {
 public:
  HostReadback() = default;
  /// Starts copying `values` (a few integer elements, any shape) to the host. On a CUDA device
  /// the copy is queued on the current stream behind the work queued so far, with an event
  /// after it; on any other device the values are read now.
  explicit HostReadback(const at::Tensor& values);
  /// The values, flattened. On CUDA the first call waits for the copy's event only: work
  /// queued after the copy keeps the device busy meanwhile.
  const std::vector<int64_t>& values();
  int64_t sum();

 private:
  struct Pending;  // the pinned buffer and the CUDA event (host_readback.cpp)
  std::shared_ptr<Pending> pending_;
  std::vector<int64_t> values_;
};

}  // namespace lt::recompute
