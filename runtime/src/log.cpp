#include "leantrain/runtime/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace lt::log {
namespace {

// The one process-wide logger; init() replaces its pattern and level.
std::shared_ptr<spdlog::logger> logger() {
  static auto l = [] {
    auto lg = spdlog::stderr_color_mt("leantrain");
    lg->set_pattern("[%H:%M:%S] %^%l%$ %v");
    return lg;
  }();
  return l;
}

bool g_info_enabled = true;

}  // namespace

void init(int rank, int world_size, bool all_ranks) {
  auto lg = logger();
  if (world_size > 1)
    lg->set_pattern("[%H:%M:%S rank " + std::to_string(rank) + "] %^%l%$ %v");
  g_info_enabled = all_ranks || rank == 0;
}

void info(const std::string& msg) {
  if (g_info_enabled) logger()->info(msg);
}
void warn(const std::string& msg) { logger()->warn(msg); }
void error(const std::string& msg) { logger()->error(msg); }

}  // namespace lt::log
