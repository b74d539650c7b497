#pragma once
// Error types that main() maps to exit codes (docs/ERRORS.md): a usage or configuration
// error exits 2, any other failure 1. Library code throws; only main() exits.
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

constexpr int kExitOk = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;
/// A collective missed its deadline (comm.timeout_s): the job was torn down with MPI_Abort.
constexpr int kExitCollectiveTimeout = 3;
/// Stopped by SIGTERM/SIGUSR1 after writing a checkpoint: resume with --resume auto
/// (EX_TEMPFAIL: schedulers and wrappers requeue on it).
constexpr int kExitPreempted = 75;

}  // namespace lt
