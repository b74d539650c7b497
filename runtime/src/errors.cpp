// The one table of errors -> exit codes (docs/ERRORS.md). The command line (lt::cli::main) and
// a program of one's own around the Trainer (lt::cli::handle_current_exception) both read it;
// test_errors holds every row to its code.
#include "leantrain/runtime/errors.h"

#include <c10/util/Exception.h>

#include <stdexcept>

namespace lt {

// Note [Errors on one rank]: config, data, checkpoint-read and report errors, and a stop on a
// non-finite loss, are reached by every rank together: the inputs are the same, or the ranks
// agreed through a collective (the loss, and the setup agreement of comm::agree_on_setup for
// the components each rank builds, so a data file missing on one rank is also every rank's
// error). Each rank then reports and exits with the code, and no rank waits. Any other failure
// (a LibTorch error, a failed checkpoint write on rank 0) happens on one rank only, and the
// others would wait for it in their next collective until the deadline: that rank reports, then
// ends the whole job at once (Communicator::abort) with its exit code.
ErrorClass classify_error(const std::exception_ptr& e) {
  if (!e) throw std::logic_error("classify_error: no exception");
  try {
    std::rethrow_exception(e);
  } catch (const ConfigError&) {
    return {"config error", kExitUsage, true};
  } catch (const CheckpointError&) {
    return {"checkpoint error", kExitUsage, true};
  } catch (const DataError&) {
    return {"data error", kExitUsage, true};
  } catch (const ReportError&) {
    return {"report", kExitUsage, true};
  } catch (const StorageError&) {
    return {"storage error", kExitStorage, false};
  } catch (const TrainingStopped&) {
    return {"training stopped", kExitFailure, true};
  } catch (const PeerFailed& p) {
    return {"stopped", p.exit_code(), true};
  } catch (...) {
    // c10::Error (LibTorch), std::exception and anything else: a failure of this rank.
    return {"error", kExitFailure, false};
  }
}

std::string error_message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error& x) {
    return x.what_without_backtrace();  // users need the message, not LibTorch's C++ backtrace
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an exception of an unknown type";
  }
}

}  // namespace lt
