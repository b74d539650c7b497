#pragma once
// Error types that main() maps to exit codes (docs/ERRORS.md): a usage or configuration
// error exits 2, a failed checkpoint write 4, any other failure 1. Library code throws; only
// main() exits (the deadline abort of comm/ is the documented exception).
#include <stdexcept>
#include <string>

namespace lt {

/// Bad command line or config: one line naming the key, the value and what is allowed.
class ConfigError : public std::runtime_error {
 public:
  explicit ConfigError(const std::string& what) : std::runtime_error(what) {}
};

/// Bad input data (a missing or malformed data file).
class DataError : public std::runtime_error {
 public:
  explicit DataError(const std::string& what) : std::runtime_error(what) {}
};

/// Every rank stopped training together, by agreement (a non-finite loss under
/// train.nonfinite = "stop", or past train.nonfinite_max_skips): no weight was corrupted.
class TrainingStopped : public std::runtime_error {
 public:
  explicit TrainingStopped(const std::string& what) : std::runtime_error(what) {}
};

/// A checkpoint could not be written (disk full, permission, file-size limit). Every earlier
/// checkpoint is intact; the message names the file and the directory.
class StorageError : public std::runtime_error {
 public:
  explicit StorageError(const std::string& what) : std::runtime_error(what) {}
};

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
/// A collective missed its deadline (comm.timeout_s): the job was torn down with MPI_Abort.
constexpr int kExitCollectiveTimeout = 3;
/// A checkpoint write failed (StorageError); the earlier checkpoints are intact.
constexpr int kExitStorage = 4;
/// Stopped by SIGTERM/SIGUSR1 after writing a checkpoint: resume with --resume auto
/// (EX_TEMPFAIL: schedulers and wrappers requeue on it).
constexpr int kExitPreempted = 75;

}  // namespace lt
