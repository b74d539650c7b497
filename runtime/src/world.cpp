#include "leantrain/runtime/world.h"

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "leantrain/runtime/errors.h"

namespace lt {
namespace {

bool env_int(const char* name, int& out) {
  const char* v = std::getenv(name);
  if (!v || !*v) return false;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0) throw ConfigError(std::string("environment ") + name + "='" + v + "' is not a non-negative integer");
  out = static_cast<int>(x);
  return true;
}

}  // namespace

World detect_world() {
  World w;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  w.host = host;
  if (env_int("OMPI_COMM_WORLD_SIZE", w.size)) {
    w.launcher = "openmpi";
    env_int("OMPI_COMM_WORLD_RANK", w.rank);
    if (!env_int("OMPI_COMM_WORLD_LOCAL_RANK", w.local_rank)) w.local_rank = w.rank;
    if (!env_int("OMPI_COMM_WORLD_LOCAL_SIZE", w.local_size)) w.local_size = w.size;
  } else if (env_int("SLURM_NTASKS", w.size) && std::getenv("SLURM_PROCID")) {
    w.launcher = "slurm";
    env_int("SLURM_PROCID", w.rank);
    if (!env_int("SLURM_LOCALID", w.local_rank)) w.local_rank = 0;
    const char* per_node = std::getenv("SLURM_NTASKS_PER_NODE");
    w.local_size = per_node ? std::max(1, std::atoi(per_node)) : 1;
  }
  if (w.size < 1 || w.rank >= w.size)
    throw ConfigError("launcher (" + w.launcher + ") reports rank " + std::to_string(w.rank) +
                      " of a world of " + std::to_string(w.size));
  return w;
}

}  // namespace lt
