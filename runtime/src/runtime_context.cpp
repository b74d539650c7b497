#include "leantrain/runtime/runtime_context.h"

#include "leantrain/runtime/memory_meter.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <malloc.h>

#include <climits>
#include <thread>

#include "leantrain/runtime/errors.h"

namespace lt {

int cuda_device_count() {
  return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
}

std::string torch_version() { return TORCH_VERSION; }

void keep_freed_memory_for_reuse() {
  mallopt(M_MMAP_THRESHOLD, INT_MAX);
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
}

RuntimeContext make_runtime_context(const Config& cfg, const World& world) {
  keep_freed_memory_for_reuse();
  RuntimeContext ctx;
  ctx.world = world;
  const int gpus = cfg.train.device == "cpu" ? 0 : cuda_device_count();
  if (cfg.train.device == "cuda" && gpus == 0)
    throw ConfigError("train.device = 'cuda': no CUDA device is visible (use 'auto' or 'cpu')");
  if (gpus > 0) {
    if (world.local_rank >= gpus && cfg.train.device == "cuda")
      throw ConfigError("train.device = 'cuda': local rank " + std::to_string(world.local_rank) +
                        " has no GPU of its own (" + std::to_string(gpus) +
                        " visible); start at most one rank per GPU");
    if (world.local_rank < gpus) ctx.device_index = world.local_rank;
  }
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ctx.threads = cfg.train.threads > 0 ? static_cast<int>(cfg.train.threads)
                                      : std::max(1, cores / std::max(1, world.local_size));
  torch::set_num_threads(ctx.threads);
  // The CPU tracker counts only tensors allocated after it is installed: before any model or
  // data set exists (Trainer's peak and budget figures include the parameters).
  if (!ctx.on_cuda()) MemoryMeter::install_cpu_tracking();
  return ctx;
}

}  // namespace lt
