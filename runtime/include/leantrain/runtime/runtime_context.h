#pragma once
// The one explicitly named bag of process-wide state: who we are (World), which device we
// compute on, and how many intra-op threads LibTorch uses. Built once by the launcher.
#include <string>

#include "leantrain/runtime/config.h"
#include "leantrain/runtime/world.h"

namespace lt {

struct RuntimeContext {
  World world;
  int device_index = -1;  // -1: CPU; otherwise the CUDA device (choose_device_index)
  int threads = 1;

  bool on_cuda() const { return device_index >= 0; }
  std::string device_string() const {
    return on_cuda() ? "cuda:" + std::to_string(device_index) : "cpu";
  }
};

/// Note [Rank to GPU]: the CUDA device of a rank, among the GPUs *this rank* sees, a pure
/// function (torch-free): -1 is the CPU.
///
///   train.device | visible GPUs  | device
///   cpu          | any           | -1
///   auto         | 0             | -1 (the CPU)
///   cuda         | 0             | ConfigError naming train.device, the local rank and host
///   auto, cuda   | v >= 1        | local_rank mod v
///
/// local_rank mod v is the local rank's GPU when every rank of the host sees all of them
/// (mpirun; Slurm --gpus-per-node: v >= ranks on the host), and one of the rank's own GPUs
/// when each rank sees only its own (Slurm --gpus-per-task, CUDA_VISIBLE_DEVICES per rank:
/// device 0 with one GPU per task). The two cannot be told apart from inside one rank, so the
/// rule needs no count of the ranks on the host (Slurm does not always give one). When all
/// ranks of a host see the same v < ranks GPUs, ranks share a GPU: comm.backend = mpi allows
/// it, NCCL does not (its initialisation fails: a duplicate GPU). So a rank that sees a GPU
/// always runs on one: `auto` no longer puts the ranks beyond the GPU count on the CPU (and
/// on MPI, while the others chose NCCL: the hang of issue 39); the ranks that still differ
/// (a host without a GPU) are refused by make_communicator (agree_backend in comm/).
/// Throws std::invalid_argument for a negative local rank.
int choose_device_index(const std::string& train_device, int visible_gpus, int local_rank,
                        const std::string& host = "");

/// Makes `index` the current CUDA device of the calling thread (c10::cuda::set_device) and
/// remembers it for bound_device(); -1 (the CPU), and any index in a LibTorch without CUDA,
/// only remembers. Every thread that touches CUDA calls it first: a new thread's current
/// device is 0, whatever the rank's is. make_runtime_context binds the calling (main) thread.
void bind_device(int index);

/// The device bind_device last bound on the calling thread (-1 when none): a thread started
/// by a bound one passes it on (`std::thread([d = bound_device()] { bind_device(d); ... })`).
int bound_device();

/// Picks the device (choose_device_index over the CUDA devices this process sees; none are
/// looked for when train.device = cpu), binds the calling thread to it (bind_device), and sets
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
