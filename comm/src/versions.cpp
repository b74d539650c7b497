// Library versions for `leantrain --version`; kept apart so MPI and NCCL headers stay
// private to comm/.
#include <mpi.h>

#include <string>

#ifdef LEANTRAIN_HAVE_NCCL
#include <nccl.h>
#endif

namespace lt::comm {

std::string mpi_library_version() {
  char buf[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  MPI_Get_library_version(buf, &len);  // callable before MPI_Init
  std::string s(buf, static_cast<size_t>(len));
  auto nl = s.find_first_of(",\n");
  return nl == std::string::npos ? s : s.substr(0, nl);
}

std::string nccl_version() {
#ifdef LEANTRAIN_HAVE_NCCL
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
#else
  return "not built";
#endif
}

}  // namespace lt::comm
