#include "leantrain/trainers/faults.h"

#include <signal.h>
#include <unistd.h>

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
                         "' is not kind@step[:rank] with kind kill | hang | throw | sigterm | nan | ckpt_fail");
    };
    if (at == std::string::npos) throw bad();
    const std::string kind = item.substr(0, at), rest = item.substr(at + 1);
    Fault fault{FaultKind::kKill, 0, -1};
    if (kind == "kill") fault.kind = FaultKind::kKill;
    else if (kind == "hang") fault.kind = FaultKind::kHang;
    else if (kind == "throw") fault.kind = FaultKind::kThrow;
    else if (kind == "sigterm") fault.kind = FaultKind::kSigterm;
    else if (kind == "nan") fault.kind = FaultKind::kNan;
    else if (kind == "ckpt_fail") fault.kind = FaultKind::kCheckpointFail;
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

}  // namespace lt::trainers
