#include "leantrain/trainers/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace lt::trainers {

MetricsWriter::MetricsWriter(const std::string& path, bool enabled, bool append) : path_(path) {
  if (!enabled) return;
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_)
    throw std::runtime_error("cannot open metrics file " + path + ": " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::event(const std::string& name, const MetricFields& fields) {
  if (!file_) return;
  nlohmann::json j;
  j["event"] = name;
  for (const auto& [k, v] : fields) {
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, double>) {
            if (std::isfinite(x)) j[k] = x;
            else j[k] = nullptr;  // JSON has no NaN/inf: null marks a non-finite value
          } else {
            j[k] = x;
          }
        },
        v);
  }
  const std::string line = j.dump() + "\n";
  std::lock_guard<std::mutex> lock(mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0)
    throw std::runtime_error("cannot write metrics file " + path_ + ": " + std::strerror(errno));
}

}  // namespace lt::trainers
