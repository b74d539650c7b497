#include "leantrain/trainers/progress.h"

#include <unistd.h>

#include <cstdio>

#include "leantrain/runtime/log.h"

namespace lt::trainers {

Progress::Progress(const std::string& mode, int64_t total_steps, int64_t every_steps, bool enabled)
    : total_(total_steps), every_(every_steps) {
  if (!enabled || mode == "none") return;
  const bool tty = isatty(fileno(stderr));
  bar_ = mode == "bar" || (mode == "auto" && tty);
  plain_ = !bar_;
}

Progress::~Progress() { interrupt(); }

void Progress::update(int64_t step, double loss, double lr, double samples_per_s) {
  char stats[160];
  std::snprintf(stats, sizeof(stats), "step %lld/%lld  loss %.4f  lr %.2e  %.1f samples/s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, lr, samples_per_s);
  if (bar_) {
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * step / total_) : width;
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(width, '.');
    std::fprintf(stderr, "\r[%s] %s", bar.c_str(), stats);
    std::fflush(stderr);
    drawn_ = true;
  } else if (plain_ && (step % every_ == 0 || step == total_ || step == 1)) {
    log::info(stats);
  }
}

void Progress::interrupt() {
  if (drawn_) {
    std::fprintf(stderr, "\n");
    drawn_ = false;
  }
}

}  // namespace lt::trainers
