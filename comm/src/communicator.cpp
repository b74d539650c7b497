#include "leantrain/comm/communicator.h"

#include "leantrain/runtime/errors.h"

namespace lt::comm {

std::unique_ptr<Communicator> make_communicator(const CommConfig& cfg, const RuntimeContext& ctx) {
  const int world = ctx.world.size;
  if (world == 1 && (cfg.backend == "auto" || cfg.backend == "local"))
    return std::make_unique<LocalCommunicator>();
  if (cfg.backend == "local")
    throw ConfigError("comm.backend = 'local' cannot serve a world of " + std::to_string(world) +
                      " ranks; use 'auto'");
  throw ConfigError("comm.backend = '" + cfg.backend + "' for a world of " + std::to_string(world) +
                    " ranks: multi-rank training is not available in this build yet "
                    "(run one process, without mpirun)");
}

}  // namespace lt::comm
