#pragma once
// The setup agreement: every rank checks in once its setup (config, model, data) has run, so
// that an error on one rank (a data file missing on that host) stops every rank at once with
// that rank's exit code instead of leaving the others to wait in their first collective
// (Note [Setup agreement], comm/src/agreement.cpp).
#include <exception>
#include <optional>
#include <utility>

#include <torch/types.h>

#include "leantrain/comm/communicator.h"

namespace lt::comm {

/// Every rank calls this at the same point, with the error its setup raised (null: none). One
/// allgather of each rank's exit code (lt::classify_error). Returns when every rank is fine;
/// rethrows this rank's own error when it has one; throws lt::PeerFailed, with the code of the
/// lowest failing rank, when only other ranks failed. `device`: where the communicator's
/// tensors live (a CUDA device for NCCL).
void agree_on_setup(Communicator& comm, const std::exception_ptr& mine, torch::Device device);

/// Runs `setup` on this rank, then agree_on_setup: its value when every rank's setup succeeded.
template <class F>
auto agreed_setup(Communicator& comm, torch::Device device, F&& setup) {
  std::optional<decltype(setup())> value;
  std::exception_ptr error;
  try {
    value.emplace(std::forward<F>(setup)());
  } catch (...) {
    error = std::current_exception();
  }
  agree_on_setup(comm, error, device);
  return std::move(*value);
}

}  // namespace lt::comm
