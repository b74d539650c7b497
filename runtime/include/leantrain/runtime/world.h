#pragma once
// Who this process is in the job, read from the launcher's environment before any
// communicator exists: Open MPI (mpirun), Slurm (srun), or no launcher (a world of one —
// the single-process fallback that never touches MPI).
#include <string>

namespace lt {

struct World {
  int rank = 0;
  int size = 1;
  int local_rank = 0;   // rank among the processes on this host: picks the GPU
  int local_size = 1;
  std::string launcher = "none";  // none | openmpi | slurm
  std::string host;
};

/// Reads OMPI_COMM_WORLD_* first, then SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID, else a
/// world of one. Throws ConfigError on inconsistent values (rank >= size).
World detect_world();

}  // namespace lt
