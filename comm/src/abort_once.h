#pragma once
// The lifetime of a handle that several threads use and one of them ends (private to comm/).
// No NCCL and no LibTorch here, so that tests/unit/test_abort_once.cpp races it on any
// machine; the NCCL backend keeps its ncclComm_t in one (Note [NCCL communicator lifetime]).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace lt::comm {

// Note [NCCL communicator lifetime]
// An ncclComm_t is used by the thread that runs the collectives (the main thread, or the
// autograd engine's device thread from a gradient hook), polled by the watchdog thread
// (ncclCommGetAsyncError), and ended by whichever of them finds the job broken: the
// watchdog's fail() (a late collective, an asynchronous error), the caller's nccl_check (a
// synchronous error), NcclCommunicator::abort, or the destructor (ncclCommDestroy). Its one
// owner is an AbortOnce, a state machine running -> aborting -> aborted:
//   - use(f): f(handle) while running, one use at a time (the NCCL calls that enqueue work:
//     normally microseconds, but they may block on peers, as NCCL connects two ranks lazily
//     inside their first collective);
//   - try_use(f): the same, but gives up at once when another use is in flight (the
//     watchdog's queries: it must never wait behind a call blocked on a dead peer, whose
//     deadline it is watching);
//   - end_once(f, grace): the first caller moves running -> aborting (no use/try_use starts
//     any more), waits up to `grace` for the call in flight to leave, runs f(handle)
//     (ncclCommAbort or ncclCommDestroy) and moves to aborted. Every later caller gets false
//     and runs nothing: the communicator is ended exactly once, and never polled after.
// If the call in flight has not left within `grace`, it is blocked on a peer that will not
// come: f runs anyway, as ncclCommAbort is what ends that wait (c10d's watchdog does the
// same), and that caller, back from NCCL, finds the communicator ended (use returns false;
// the NCCL backend then waits for the job's MPI_Abort or throws) and never touches it again.

// Handle: a pointer or another copyable type whose Handle{} means "none".
template <class Handle>
class AbortOnce {
 public:
  enum class State { kRunning, kAborting, kAborted };

  /// Keeps `h` (once created). False, and `h` not kept, when the end has begun already.
  bool publish(Handle h) {
    std::lock_guard<std::mutex> lk(mu_);
    if (state_.load() != State::kRunning) return false;
    handle_ = h;
    return true;
  }

  /// Runs f(handle) while running with a handle published, one use at a time (it waits for
  /// the use in flight, or for the end to begin); false, f not run, otherwise.
  template <class F>
  bool use(F&& f) {
    Handle h{};
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return !busy_ || state_.load() != State::kRunning; });
      if (!claim(h)) return false;
    }
    Release release{*this};
    f(h);
    return true;
  }

  /// As use(), but false at once (f not run) when a use is in flight.
  template <class F>
  bool try_use(F&& f) {
    Handle h{};
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (busy_ || !claim(h)) return false;
    }
    Release release{*this};
    f(h);
    return true;
  }

  /// For exactly one caller over the object's life: runs f(handle) — the handle published,
  /// or Handle{} when none was — once the use in flight has returned or `grace` has passed,
  /// and returns true. Every other caller returns false at once, without waiting. f must not
  /// call use/try_use/end_once on this object.
  template <class F>
  bool end_once(F&& f, std::chrono::milliseconds grace = std::chrono::milliseconds(2000)) {
    Handle h{};
    {
      std::unique_lock<std::mutex> lk(mu_);
      if (state_.load() != State::kRunning) return false;
      state_ = State::kAborting;  // from here no use starts, and the handle is final
      cv_.notify_all();           // uses waiting for their turn give up
      // Not done within the grace: that use is blocked on a peer; f (the abort) frees it.
      cv_.wait_for(lk, grace, [&] { return !busy_; });
      h = handle_;
    }
    f(h);
    state_ = State::kAborted;
    return true;
  }

  /// Running: not ended, nor ending.
  bool usable() const { return state_.load() == State::kRunning; }
  State state() const { return state_.load(); }

 private:
  // Under mu_: marks a use in flight and hands out the handle, while running with one.
  bool claim(Handle& h) {
    if (state_.load() != State::kRunning || !(handle_ != Handle{})) return false;
    busy_ = true;
    h = handle_;
    return true;
  }
  struct Release {
    AbortOnce& o;
    ~Release() {
      {
        std::lock_guard<std::mutex> lk(o.mu_);
        o.busy_ = false;
      }
      o.cv_.notify_all();
    }
  };

  std::mutex mu_;
  std::condition_variable cv_;
  bool busy_ = false;  // a use's f is running; guarded by mu_
  std::atomic<State> state_{State::kRunning};
  Handle handle_{};  // guarded by mu_; final once the state left running
};

}  // namespace lt::comm
