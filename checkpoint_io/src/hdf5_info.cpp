#include "leantrain/checkpoint_io/hdf5_info.h"

#include <hdf5.h>

namespace lt::checkpoint_io {

std::string hdf5_version() {
  unsigned maj = 0, min = 0, rel = 0;
  H5get_libversion(&maj, &min, &rel);
  return std::to_string(maj) + "." + std::to_string(min) + "." + std::to_string(rel);
}

}  // namespace lt::checkpoint_io
