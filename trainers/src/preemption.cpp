#include "leantrain/trainers/preemption.h"

#include <csignal>

#include <atomic>

namespace lt::trainers {
namespace {
std::atomic<int> g_signal{0};
extern "C" void on_preempt(int sig) { g_signal.store(sig); }
}  // namespace

void install_preemption_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_preempt;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);
}

bool preemption_requested() { return g_signal.load() != 0; }

int preemption_signal() { return g_signal.load(); }

}  // namespace lt::trainers
