#pragma once
// Error types, and the one table that maps every exception to its exit code and says whether
// every rank reaches it (classify_error; the table is in runtime/src/errors.cpp, docs/ERRORS.md
// lists it). Library code throws; only a program's main() exits (lt::cli::main, or a user's own
// main through lt::cli::handle_current_exception), and the deadline abort of comm/ is the
// documented exception.
#include <exception>
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

/// An unreadable, damaged or mismatched checkpoint: the message names the file and what is
/// wrong (every mismatching tensor, for a model mismatch). Also lt::checkpoint_io::CheckpointError.
class CheckpointError : public std::runtime_error {
 public:
  explicit CheckpointError(const std::string& what) : std::runtime_error(what) {}
};

/// `report`'s input cannot be drawn (a malformed metrics.jsonl, no gnuplot, an output folder
/// holding other files). Also lt::report::ReportError.
class ReportError : public std::runtime_error {
 public:
  explicit ReportError(const std::string& what) : std::runtime_error(what) {}
};

/// This rank is fine, but another rank failed where every rank checks in (the setup agreement,
/// comm::agree_on_setup): every rank exits with that rank's code, and none waits for a deadline.
class PeerFailed : public std::runtime_error {
 public:
  PeerFailed(const std::string& what, int exit_code) : std::runtime_error(what), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
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

/// What an exception means to a program: its row of the table in runtime/src/errors.cpp.
struct ErrorClass {
  const char* label;  // the message's lead: "config error", "data error", ... ("error": any other)
  int exit_code;
  /// Reached by every rank of a job together, so each rank may report it and exit; otherwise
  /// only this rank knows, and it must end the job (Note [Errors on one rank], errors.cpp).
  bool every_rank;
};

/// The class of `e` (any exception; a null pointer is a logic error). The one table of errors
/// to exit codes: the command line uses it, and so should any program of one's own.
ErrorClass classify_error(const std::exception_ptr& e);

/// `e`'s message: what(), without the C++ backtrace LibTorch errors carry.
std::string error_message(const std::exception_ptr& e);

}  // namespace lt
