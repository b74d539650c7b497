#pragma once
// safetensors files (https://github.com/huggingface/safetensors), read and written without a
// third-party library:
//
//   8 bytes     N, the header's length, unsigned little-endian
//   N bytes     JSON object: "<name>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
//               and optionally "__metadata__": {"<key>": "<string>", ...}
//   the rest    the data; tensor bytes [b, e) relative to the end of the header, C order,
//               little-endian
//
// Note [Never trust a safetensors file]
// The reader checks everything before it allocates a tensor: the header length against the
// cap (100 MB, as the reference implementation) and against the file size, the JSON, every
// entry's dtype, shape (non-negative, no overflow) and offsets (begin <= end, end inside the
// data, e - b = numel x dtype size), and that no two tensors' bytes overlap. Each failure is
// an lt::DataError naming the file and the tensor. The writer writes the data contiguously
// in the order given, pads the header with spaces to 8 bytes (as the reference does), and
// commits atomically (temporary name, fsync, rename): a failure leaves nothing at `path`.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "leantrain/checkpoint_io/checkpoint.h"

namespace lt::checkpoint_io {

/// The reference implementation's cap on the JSON header (safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;           // in the order of their data offsets
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

/// Reads and checks the whole file (Note [Never trust a safetensors file]). Supported dtypes:
/// F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL F8_E4M3 F8_E5M2. Throws lt::DataError naming
/// `path` (and the tensor, for an entry's problem).
SafetensorsFile read_safetensors(const std::string& path);

/// Writes `tensors` (CPU or not; written contiguous, in this order) and `metadata` to `path`
/// atomically. Names must be non-empty, unique and not "__metadata__". Throws lt::StorageError
/// naming the file when it cannot be written (nothing is left at `path` or beside it), and
/// lt::DataError for a tensor that safetensors cannot hold.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

/// The safetensors dtype name of a torch dtype ("F32", ...), or "" when it has none.
std::string safetensors_dtype_name(torch::ScalarType t);

}  // namespace lt::checkpoint_io
