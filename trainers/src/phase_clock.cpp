#include "leantrain/trainers/phase_clock.h"

#include <chrono>

#ifdef LEANTRAIN_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lt::trainers {

// Note [Step timings on a GPU]
// On the CPU a kernel runs when it is called, so host clocks around a phase time the phase.
// On a GPU a call only queues the kernel: host clocks time the launches, and the device's
// time lands wherever the host next waits for the device. Without events compute_s read the
// launch time, comm_exposed_s close to 0 (Work::wait() only orders streams), and the step's
// one synchronisation (the all-reduce of the loss and flags, agree_on_step) absorbed the
// forward and backward into the update. So on a CUDA device the Trainer's marks are CUDA
// events (timing enabled) recorded on the compute stream, the current stream of the thread
// that marks (backward's thread for the first gradient bucket, which the autograd engine runs
// on the forward's stream), at the points where the host clocks stood:
//   data_time_s      before and after taking the micro-batch: the time the device waited
//                    for the batch beyond the work already queued (0 when the prefetcher
//                    kept up);
//   compute_s        from there to the end of backward: the copy to the device, forward,
//                    backward;
//   comm_exposed_s   from backward's end to the end of GradientSync::finish(): the time the
//                    compute stream waited for the collectives (finish() makes it wait for the
//                    NCCL stream's completion events);
//   comm_time_s      from the first bucket starting (GradientSync's first-bucket hook: the
//                    NCCL stream waits for the compute stream at that point) to the same end;
//   update_s         the gradient reduction, the step's agreement and the optimizer update.
// Nothing is read in the middle of the step. done() reads the spans once, after waiting for the
// update's last event: the one wait this adds, at the end of the step (the next step's first
// kernels are queued a few microseconds later than the host could have queued them).
// step_time_s stays a host clock, from the step's start to that end, so it now includes the
// update's device time. The events are kept and re-recorded every step. On the CPU the marks
// are steady_clock readings at the same points: the same figures as before. metrics.jsonl's
// `timing` says which ("cuda_events" or "host"); tested on the CPU (PhaseClock.*), the CUDA
// events unverified until a GPU run.

namespace {

class HostClock final : public PhaseClock {
 public:
  const char* source() const override { return "host"; }
  bool on_device() const override { return false; }

 protected:
  void record(Mark m) override {
    if (m >= times_.size()) times_.resize(m + 1);
    times_[m] = std::chrono::steady_clock::now();
  }
  double between(Mark from, Mark to) override {
    return std::chrono::duration<double>(times_.at(to) - times_.at(from)).count();
  }

 private:
  std::vector<std::chrono::steady_clock::time_point> times_;
};

#ifdef LEANTRAIN_TORCH_CUDA
class CudaEventClock final : public PhaseClock {
 public:
  explicit CudaEventClock(c10::DeviceIndex device) : device_(device) {}
  const char* source() const override { return "cuda_events"; }
  bool on_device() const override { return true; }

 protected:
  void record(Mark m) override {
    while (m >= events_.size()) events_.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    events_[m]->record(c10::cuda::getCurrentCUDAStream(device_));
  }
  double between(Mark from, Mark to) override {
    events_.at(to)->synchronize();  // done already where the step synchronised
    events_.at(from)->synchronize();
    return static_cast<double>(events_[from]->elapsed_time(*events_[to])) / 1000.0;
  }

 private:
  c10::DeviceIndex device_;
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events_;  // one per mark, reused every step
};
#endif

}  // namespace

std::unique_ptr<PhaseClock> PhaseClock::for_device(const c10::Device& device) {
#ifdef LEANTRAIN_TORCH_CUDA
  if (device.is_cuda()) return std::make_unique<CudaEventClock>(device.index() < 0 ? 0 : device.index());
#endif
  (void)device;
  return std::make_unique<HostClock>();
}

PhaseClock::Mark PhaseClock::mark() {
  std::lock_guard<std::mutex> lock(mutex_);
  const Mark m = next_++;
  record(m);
  return m;
}

void PhaseClock::add(Phase phase, Mark from, Mark to) {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back({phase, from, to});
}

double PhaseClock::seconds(Mark from, Mark to) {
  std::lock_guard<std::mutex> lock(mutex_);
  return between(from, to);
}

std::array<double, PhaseClock::kPhases> PhaseClock::read() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::array<double, kPhases> s{};
  for (const auto& span : spans_) s[span.phase] += between(span.from, span.to);
  return s;
}

void PhaseClock::begin_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  next_ = 0;
  spans_.clear();
}

}  // namespace lt::trainers
