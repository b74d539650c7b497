#pragma once
// Training progress for people: a redrawn bar on a terminal, plain lines every N steps
// otherwise (logs, CI), nothing when disabled. Only rank 0 shows it.
#include <cstdint>
#include <string>

namespace lt::trainers {

class Progress {
 public:
  /// mode: auto | bar | plain | none (log.progress); auto = bar on a TTY, else plain.
  Progress(const std::string& mode, int64_t total_steps, int64_t every_steps, bool enabled);
  ~Progress();
  void update(int64_t step, double loss, double lr, double samples_per_s);
  /// Ends the bar line before other output (epoch summaries).
  void interrupt();

 private:
  bool bar_ = false, plain_ = false, drawn_ = false;
  int64_t total_, every_;
};

}  // namespace lt::trainers
