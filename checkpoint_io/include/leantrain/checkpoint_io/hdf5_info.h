#pragma once
// checkpoint_io/ owns HDF5 (the checkpoint format is in docs/CHECKPOINTS.md once written).
#include <string>

namespace lt::checkpoint_io {

/// The HDF5 library version linked into this binary, e.g. "1.10.8".
std::string hdf5_version();

}  // namespace lt::checkpoint_io
