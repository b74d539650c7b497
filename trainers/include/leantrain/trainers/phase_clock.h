#pragma once
// Where a step's phases (data wait, compute, update, gradient communication) are timed: host
// clocks on the CPU, CUDA events on a GPU (Note [Step timings on a GPU] in
// trainers/src/phase_clock.cpp). The Trainer marks the same points either way.
#include <array>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include <c10/core/Device.h>

namespace lt::trainers {

class PhaseClock {
 public:
  enum Phase : size_t { kData, kCompute, kUpdate, kPhases };
  using Mark = size_t;

  /// CUDA events on a CUDA device (when LibTorch has CUDA), host clocks elsewhere.
  static std::unique_ptr<PhaseClock> for_device(const c10::Device& device);
  virtual ~PhaseClock() = default;

  /// What metrics.jsonl's `timing` says: "cuda_events" or "host".
  virtual const char* source() const = 0;
  /// Whether marks are points on the device's timeline (events), not the host's.
  virtual bool on_device() const = 0;

  /// A point of the step: the host's clock now, or an event recorded on the calling thread's
  /// current stream of the device. Thread-safe (backward's thread marks too).
  Mark mark();
  /// [from, to] counts towards `phase` in read().
  void add(Phase phase, Mark from, Mark to);
  /// Seconds from `from` to `to`. On a device it waits for `to` to complete first: call it
  /// where the step has synchronised anyway, or at its end (Note [Step timings on a GPU]).
  double seconds(Mark from, Mark to);
  /// Each phase's seconds, summed over the spans added since begin_step().
  std::array<double, kPhases> read();
  /// Forgets the step's marks and spans; the events are kept for the next step.
  void begin_step();

 protected:
  virtual void record(Mark m) = 0;             // mark m is taken now (marks are 0, 1, 2, ...)
  virtual double between(Mark from, Mark to) = 0;  // seconds; `to` complete

 private:
  struct Span {
    Phase phase;
    Mark from, to;
  };
  std::mutex mutex_;
  Mark next_ = 0;
  std::vector<Span> spans_;
};

}  // namespace lt::trainers
