#include "leantrain/trainers/turns.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"

namespace lt::trainers {

StepTurns StepTurns::from_env() {
  const char* v = std::getenv("LEANTRAIN_BENCH_TURNS");
  if (v == nullptr || *v == '\0') return {};
  const std::string s(v);
  const auto colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == s.size())
    throw ConfigError("LEANTRAIN_BENCH_TURNS = '" + s + "': expected GO_FIFO:DONE_FIFO (two paths)");
  return StepTurns(s.substr(0, colon), s.substr(colon + 1));
}

StepTurns::StepTurns(const std::string& go_path, const std::string& done_path) {
  // The harness holds both FIFOs open read-write, so neither open blocks.
  go_ = ::open(go_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (go_ < 0)
    throw ConfigError("LEANTRAIN_BENCH_TURNS: cannot open '" + go_path + "': " + std::strerror(errno));
  done_ = ::open(done_path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (done_ < 0) {
    const int err = errno;
    close_all();
    throw ConfigError("LEANTRAIN_BENCH_TURNS: cannot open '" + done_path + "' for writing: " + std::strerror(err) +
                      (err == ENXIO ? " (nobody reads it)" : ""));
  }
  // A harness that exits makes a write fail with EPIPE: take it as an error, not a signal.
  ::signal(SIGPIPE, SIG_IGN);
}

StepTurns::StepTurns(StepTurns&& o) noexcept : go_(std::exchange(o.go_, -1)), done_(std::exchange(o.done_, -1)) {}

StepTurns& StepTurns::operator=(StepTurns&& o) noexcept {
  if (this != &o) {
    close_all();
    go_ = std::exchange(o.go_, -1);
    done_ = std::exchange(o.done_, -1);
  }
  return *this;
}

StepTurns::~StepTurns() { close_all(); }

void StepTurns::close_all() {
  if (go_ >= 0) ::close(go_);
  if (done_ >= 0) ::close(done_);
  go_ = done_ = -1;
}

namespace {
// One byte through a FIFO, retried on EINTR; false when the harness is gone (end of file on
// GO, EPIPE on DONE).
template <typename Io>
bool one_byte(Io io) {
  ssize_t n;
  do {
    n = io();
  } while (n < 0 && errno == EINTR);
  return n == 1;
}
}  // namespace

void StepTurns::harness_gone() {
  log::warn("LEANTRAIN_BENCH_TURNS: the harness went away; going on without turns");
  close_all();
}

void StepTurns::wait_turn() {
  char c = 0;
  if (enabled() && !one_byte([&] { return ::read(go_, &c, 1); })) harness_gone();
}

void StepTurns::end_turn() {
  const char c = 'd';
  if (enabled() && !one_byte([&] { return ::write(done_, &c, 1); })) harness_gone();
}

}  // namespace lt::trainers
