#include "leantrain/trainers/faults.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"

namespace lt::trainers {

FaultInjector FaultInjector::parse(const std::string& spec) {
  FaultInjector f;
  std::stringstream ss(spec);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    const auto at = item.find('@');
    auto bad = [&] {
      return ConfigError("LEANTRAIN_FAULT = '" + spec + "': '" + item +
                         "' is not kind@step[:rank] with kind kill | hang | throw | sigterm | nan | oom | ckpt_fail | ckpt_kill");
    };
    if (at == std::string::npos) throw bad();
    const std::string kind = item.substr(0, at), rest = item.substr(at + 1);
    Fault fault{FaultKind::kKill, 0, -1};
    if (kind == "kill") fault.kind = FaultKind::kKill;
    else if (kind == "hang") fault.kind = FaultKind::kHang;
    else if (kind == "throw") fault.kind = FaultKind::kThrow;
    else if (kind == "sigterm") fault.kind = FaultKind::kSigterm;
    else if (kind == "nan") fault.kind = FaultKind::kNan;
    else if (kind == "oom") fault.kind = FaultKind::kOom;
    else if (kind == "ckpt_fail") fault.kind = FaultKind::kCheckpointFail;
    else if (kind == "ckpt_kill") fault.kind = FaultKind::kCheckpointKill;
    else throw bad();
    try {
      const auto colon = rest.find(':');
      size_t used = 0;
      fault.step = std::stoll(rest.substr(0, colon), &used);
      if (used != rest.substr(0, colon).size() || fault.step < 1) throw bad();
      if (colon != std::string::npos) fault.rank = std::stoi(rest.substr(colon + 1));
    } catch (const std::logic_error&) {
      throw bad();
    }
    f.faults_.push_back(fault);
  }
  return f;
}

FaultInjector FaultInjector::from_env() {
  const char* spec = std::getenv("LEANTRAIN_FAULT");
  return spec == nullptr ? FaultInjector{} : parse(spec);
}

bool FaultInjector::fires(FaultKind kind, int64_t step, int rank) const {
  for (const auto& f : faults_)
    if (f.kind == kind && f.step == step && (f.rank < 0 || f.rank == rank)) return true;
  return false;
}

void FaultInjector::at_step_start(int64_t step, int rank) const {
  if (faults_.empty()) return;
  const std::string where = "step " + std::to_string(step) + " on rank " + std::to_string(rank);
  if (fires(FaultKind::kSigterm, step, rank)) {
    log::warn("fault injection: SIGTERM at " + where);
    ::raise(SIGTERM);
  }
  if (fires(FaultKind::kThrow, step, rank)) throw std::runtime_error("fault injection: an error at " + where);
  if (fires(FaultKind::kKill, step, rank)) {
    log::warn("fault injection: SIGKILL at " + where);
    ::kill(::getpid(), SIGKILL);
  }
  if (fires(FaultKind::kHang, step, rank)) {
    log::warn("fault injection: hanging at " + where);
    for (;;) ::pause();
  }
}

namespace {
extern "C" void die_now(int) { ::kill(::getpid(), SIGKILL); }
}  // namespace

FileSizeFault::FileSizeFault(int64_t bytes, bool kill) {
  struct rlimit old {};
  ::getrlimit(RLIMIT_FSIZE, &old);
  old_cur_ = static_cast<uint64_t>(old.rlim_cur);
  old_max_ = static_cast<uint64_t>(old.rlim_max);
  old_handler_ = std::signal(SIGXFSZ, kill ? die_now : SIG_IGN);
  struct rlimit lim = old;
  lim.rlim_cur = static_cast<rlim_t>(bytes);
  ::setrlimit(RLIMIT_FSIZE, &lim);
  log::warn("fault injection: files may not grow past " + std::to_string(bytes) + " bytes" +
            (kill ? " (the process dies at the first write past it)" : " (writes past it fail)"));
}

FileSizeFault::~FileSizeFault() {
  struct rlimit old {};
  old.rlim_cur = static_cast<rlim_t>(old_cur_);
  old.rlim_max = static_cast<rlim_t>(old_max_);
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, old_handler_);
}

}  // namespace lt::trainers
