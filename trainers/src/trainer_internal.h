#pragma once
// What the Trainer's files share: trainer.cpp (setup, the step, the loop) and
// trainer_outputs.cpp (evaluation, and what a run writes and logs: metrics, checkpoints).
// Private to trainers/.
#include <c10/util/Exception.h>

#include <chrono>
#include <string>

namespace lt::trainers::trainer_detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The first line of a LibTorch message, without its C++ context.
inline std::string first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  const auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

}  // namespace lt::trainers::trainer_detail
