#pragma once
// The output folder appears whole or not at all: files go to `<out>.tmp-XXXXXX` first.
#include <string>

namespace lt::report::detail {

class Staging {
 public:
  /// Creates `out`'s parent (mkdir -p) and the staging folder beside `out`; throws ReportError
  /// when `out` holds files that are not a leantrain report.
  explicit Staging(const std::string& out);
  /// Removes the staging folder unless commit() succeeded.
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  const std::string& dir() const { return dir_; }
  /// Writes `name` (relative, its folders are created) inside the staging folder.
  void write(const std::string& name, const std::string& content) const;
  /// Replaces `out` (absent, empty, or a previous report) by the staging folder. Throws
  /// ReportError, touching nothing, when `out` holds files that are not a report.
  void commit();

 private:
  std::string out_, dir_;
  bool committed_ = false;
};

}  // namespace lt::report::detail
