#include "leantrain/comm/communicator.h"

#include <stdexcept>

#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/comm/nccl_communicator.h"
#include "leantrain/runtime/errors.h"

namespace lt::comm {

torch::Tensor shard_chunk(const torch::Tensor& t, int rank, int world) {
  if (world <= 0 || t.numel() % world != 0)
    throw std::invalid_argument("shard_chunk: " + std::to_string(t.numel()) + " elements do not split into " +
                                std::to_string(world) + " equal chunks (Note [Shard chunks])");
  const int64_t c = t.numel() / world;
  return t.reshape({-1}).narrow(0, rank * c, c);
}

std::unique_ptr<Work> Communicator::reduce_scatter_sum_async(torch::Tensor t) {
  (void)shard_chunk(t, rank(), size());  // the contract's check
  ++stats_.reduce_scatter_calls;
  stats_.reduce_scatter_bytes += static_cast<int64_t>(t.nbytes());
  allreduce_sum(t);
  return std::make_unique<CompletedWork>();
}

std::unique_ptr<Work> Communicator::allgather_async(torch::Tensor t) {
  auto mine = shard_chunk(t, rank(), size());
  ++stats_.allgather_calls;
  stats_.allgather_bytes += static_cast<int64_t>(t.nbytes());
  const auto parts = allgather(mine.clone());
  for (int r = 0; r < size(); ++r)
    if (r != rank()) shard_chunk(t, r, size()).copy_(parts[static_cast<size_t>(r)]);
  return std::make_unique<CompletedWork>();
}

std::string choose_backend(const std::string& backend, int world, bool on_cuda, bool nccl_available) {
  if (backend == "local") {
    if (world != 1)
      throw ConfigError("comm.backend = 'local' cannot serve a world of " + std::to_string(world) +
                        " ranks; use 'auto' (or 'nccl' on GPUs, 'mpi' on CPUs)");
    return "local";
  }
  if (backend == "nccl") {
    if (!nccl_available)
      throw ConfigError("comm.backend = 'nccl': this leantrain was built without NCCL (no CUDA toolkit at build "
                        "time); use comm.backend = 'auto' or 'mpi', or rebuild with the CUDA toolkit and NCCL");
    if (!on_cuda)
      throw ConfigError("comm.backend = 'nccl' needs the run on a GPU, but the device is the CPU; set "
                        "train.device = cuda on a machine with GPUs, or use comm.backend = 'auto' or 'mpi'");
    return "nccl";
  }
  if (backend == "mpi") return "mpi";
  if (backend == "auto") {
    if (world == 1) return "local";
    return on_cuda && nccl_available ? "nccl" : "mpi";
  }
  throw ConfigError("comm.backend = '" + backend + "' is not one of auto, nccl, mpi, local");
}

std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx) {
  const int world = ctx.world.size;
  const std::string backend = choose_backend(cfg.backend, world, ctx.on_cuda(), nccl_built());
  if (backend == "local") return std::make_unique<LocalCommunicator>();
  // Setup (bootstrap, the first broadcasts) runs under the generous deadline; the trainer
  // tightens it per step (Note [Deadlines] in trainers/src/trainer.cpp).
  std::unique_ptr<Communicator> comm;
  if (backend == "nccl")
    comm = std::make_unique<NcclCommunicator>(cfg.startup_timeout_s, ctx.world.host, ctx.device_index);
  else
    comm = std::make_unique<MpiCommunicator>(cfg.startup_timeout_s, ctx.world.host);
  if (comm->size() != world || comm->rank() != ctx.world.rank)
    throw ConfigError("the launcher's environment says rank " + std::to_string(ctx.world.rank) + " of " +
                      std::to_string(world) + " but MPI says rank " + std::to_string(comm->rank()) + " of " +
                      std::to_string(comm->size()) + " (start ranks with mpirun or srun --mpi=pmix)");
  return comm;
}

}  // namespace lt::comm
