#include "leantrain/comm/communicator.h"

#include "leantrain/comm/mpi_communicator.h"
#include "leantrain/runtime/errors.h"

namespace lt::comm {

std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx) {
  const int world = ctx.world.size;
  if (world == 1 && (cfg.backend == "auto" || cfg.backend == "local"))
    return std::make_unique<LocalCommunicator>();
  if (cfg.backend == "local")
    throw ConfigError("comm.backend = 'local' cannot serve a world of " + std::to_string(world) +
                      " ranks; use 'auto' or 'mpi'");
  if (cfg.backend == "nccl")
    throw ConfigError("comm.backend = 'nccl': the NCCL backend is not built yet; use 'auto' or 'mpi' "
                      "(CUDA tensors then travel through host memory)");
  auto comm = std::make_unique<MpiCommunicator>(cfg.timeout_s, ctx.world.host);
  if (comm->size() != world || comm->rank() != ctx.world.rank)
    throw ConfigError("the launcher's environment says rank " + std::to_string(ctx.world.rank) + " of " +
                      std::to_string(world) + " but MPI says rank " + std::to_string(comm->rank()) + " of " +
                      std::to_string(comm->size()) + " (start ranks with mpirun or srun --mpi=pmix)");
  return comm;
}

}  // namespace lt::comm
