#pragma once
// FP32 HDF5 checkpoints (format version 1; layout in docs/CHECKPOINTS.md and PRODUCT.md).
//
//   /            attributes: format = "leantrain-checkpoint", format_version, step, epoch,
//                samples_seen, world_size, global_batch, micro_batch, accumulation,
//                precision, model_config / train_config / config (JSON text),
//                leantrain_version, libtorch_version
//   /model/<name>              one dataset per parameter and buffer (named_parameters() /
//                              named_buffers() names), parameters FP32
//   /optimizer/<param>/<state> exp_avg, exp_avg_sq, momentum_buffer, step ...; attributes
//                              on /optimizer: kind and hyper-parameters
//   /scaler                    attributes: scale, growth_tracker, growth_factor, ...
//   /data                      attributes: seed, epoch, position
//
// Every dataset carries a `crc32` attribute (zlib CRC-32 of its raw little-endian bytes in
// C order) and the file is written with HDF5's latest format, whose metadata is checksummed:
// a flipped byte anywhere is detected before a value is used. Writing is atomic (temporary
// name, fsync, rename, fsync the directory).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <torch/types.h>

#include "leantrain/runtime/errors.h"

namespace lt::checkpoint_io {

inline constexpr int64_t kFormatVersion = 1;
inline constexpr const char* kFormatName = "leantrain-checkpoint";

/// An unreadable, damaged or mismatched checkpoint (declared in runtime/errors.h, beside the
/// table that gives it exit code 2).
using CheckpointError = ::lt::CheckpointError;

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;  // CPU, contiguous
};

struct Checkpoint {
  int64_t format_version = kFormatVersion;
  int64_t step = 0, epoch = 0, samples_seen = 0;
  int64_t world_size = 1, global_batch = 0, micro_batch = 0, accumulation = 1;
  std::string precision = "fp32";
  std::string model_config, train_config, config;  // JSON text
  std::string leantrain_version, libtorch_version;

  std::vector<NamedTensor> model;      // /model/<name>
  std::string optimizer_kind;          // adamw | sgd
  std::map<std::string, double> optimizer_attrs;
  std::vector<NamedTensor> optimizer;  // name "<param>/<state>" -> /optimizer/<param>/<state>
  std::map<std::string, double> scaler;
  std::map<std::string, int64_t> data;
};

struct WriteStats {
  int64_t bytes = 0;
  double seconds = 0;
};

/// Writes `c` to `path` atomically; on any failure (disk full, permission, size limit) the
/// temporary file is removed, nothing at `path` changes, and CheckpointError is thrown.
WriteStats write_checkpoint(const std::string& path, const Checkpoint& c);

/// Writes plain tensors as root datasets of an HDF5 file (e.g. IO.h5 with `input` and
/// `output` for tools/leantrain_py/check_outputs.py), each with its `crc32` attribute, in the
/// same format and with the same atomic commit as a checkpoint. Names must be non-empty and
/// contain no '/'. Throws CheckpointError naming the file.
WriteStats write_tensor_file(const std::string& path, const std::vector<NamedTensor>& tensors);

/// Reads and verifies a whole checkpoint (format, version, every checksum) before returning
/// any value. Throws CheckpointError naming the file and the problem.
Checkpoint read_checkpoint(const std::string& path);

/// Checks `c.model` against the expected names, shapes and dtypes; throws CheckpointError
/// listing every missing, unexpected or mismatched tensor. Names in `skip_mismatched` may
/// differ in shape (fine-tuning a new head); they are returned as skipped.
std::vector<std::string> check_model(const Checkpoint& c, const std::vector<NamedTensor>& expected,
                                     const std::string& path, bool allow_shape_mismatch = false);

/// A human summary (or JSON with `json`) for `leantrain inspect`.
std::string describe(const Checkpoint& c, const std::string& path, bool json);

// Directory of checkpoints: step-<8 digits>.h5 files and a `latest` pointer file.
std::string checkpoint_filename(int64_t step);
/// Commits `c` into `dir`: writes step-N.h5, updates `latest`, removes all but the newest
/// `keep_last` (0 keeps all).
WriteStats commit_checkpoint(const std::string& dir, const Checkpoint& c, int64_t keep_last);
/// Checkpoint files in `dir`, newest step first (the pointer's target first when valid).
std::vector<std::string> list_checkpoints(const std::string& dir);

}  // namespace lt::checkpoint_io
