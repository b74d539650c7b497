#include "leantrain/runtime/runtime_context.h"

#include "leantrain/runtime/memory_meter.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <malloc.h>

#ifdef LEANTRAIN_TORCH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <climits>
#include <stdexcept>
#include <thread>

#include "leantrain/runtime/errors.h"

namespace lt {
namespace {

thread_local int t_bound_device = -1;

}  // namespace

int choose_device_index(const std::string& train_device, int visible_gpus, int local_rank, const std::string& host) {
  if (local_rank < 0)
    throw std::invalid_argument("choose_device_index: local rank " + std::to_string(local_rank) + " < 0");
  if (train_device == "cpu") return -1;
  if (visible_gpus <= 0) {
    if (train_device == "cuda")
      throw ConfigError("train.device = 'cuda': no CUDA device is visible to local rank " + std::to_string(local_rank) +
                        (host.empty() ? "" : " on host " + host) +
                        " (check CUDA_VISIBLE_DEVICES and the driver); use 'auto' or 'cpu'");
    return -1;
  }
  // Note [Rank to GPU] (runtime_context.h): the local rank's GPU among those this rank sees.
  return local_rank % visible_gpus;
}

void bind_device(int index) {
#ifdef LEANTRAIN_TORCH_CUDA
  if (index >= 0) c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
#endif
  t_bound_device = index;
}

int bound_device() { return t_bound_device; }

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
  ctx.device_index = choose_device_index(cfg.train.device, gpus, world.local_rank, world.host);
  if (ctx.on_cuda()) bind_device(ctx.device_index);  // the main thread's; other threads bind their own
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
