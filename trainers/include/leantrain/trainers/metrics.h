#pragma once
// metrics.jsonl: one JSON object per line, each with an "event" field (PRODUCT.md). Lines
// are written whole and flushed, so a killed run leaves only complete lines.
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace lt::trainers {

using MetricValue = std::variant<int64_t, double, std::string, bool>;
using MetricFields = std::vector<std::pair<std::string, MetricValue>>;

/// Thread-safe: the checkpoint writer's thread reports its events while the training thread
/// reports steps; each event is one whole line.
class MetricsWriter {
 public:
  /// Disabled writers (ranks other than 0) accept events and write nothing.
  MetricsWriter(const std::string& path, bool enabled, bool append = false);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;

  void event(const std::string& name, const MetricFields& fields);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  std::mutex mu_;  // one event at a time
};

}  // namespace lt::trainers
