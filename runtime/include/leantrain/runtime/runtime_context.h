#pragma once
// The one explicitly named bag of process-wide state: who we are (World), which device we
// compute on, and how many intra-op threads LibTorch uses. Built once by the launcher.
#include <string>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/world.h"

namespace lt {

struct RuntimeContext {
  World world;
  int device_index = -1;  // -1: CPU; otherwise the CUDA device (the local rank's)
  int threads = 1;

  bool on_cuda() const { return device_index >= 0; }
  std::string device_string() const {
    return on_cuda() ? "cuda:" + std::to_string(device_index) : "cpu";
  }
};

/// Picks the device from train.device (auto: CUDA when a GPU is visible, else CPU; cuda:
/// an error naming train.device when none is), binds the local rank to a GPU, and sets
/// LibTorch's intra-op threads to train.threads or cores / ranks on this host (LibTorch
/// starts with one thread on these machines).
RuntimeContext make_runtime_context(const Config& cfg, const World& world);

/// Makes glibc keep freed memory for reuse instead of returning large blocks to the kernel:
/// on these VMs fresh pages fault in at ~0.3 GB/s, which made big tensors (logits,
/// activations) cost more than the arithmetic on them. Called by make_runtime_context.
void keep_freed_memory_for_reuse();

/// Number of CUDA devices LibTorch can use (0 without a driver).
int cuda_device_count();

/// "2.11.0" — the LibTorch this binary was built against.
std::string torch_version();

}  // namespace lt
