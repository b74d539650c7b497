#pragma once
// JSON-lines input with line numbers, so every complaint can name "FILE:LINE".
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace lt::report::detail {

struct Line {
  int64_t number = 0;  ///< 1-based line number in the file
  nlohmann::json value;
};

/// The objects of a JSON-lines file; blank lines are ignored. A line that is not a JSON
/// object throws ReportError "FILE:LINE: ...", except a last line without its newline (a
/// writer killed mid-line; Note [Truncated last line]) which is skipped with a warning.
/// A missing file throws ReportError.
std::vector<Line> read_jsonl(const std::string& path, std::vector<std::string>& warnings);

/// Field `key` as a number: NaN when absent or null (README: a non-finite number is written
/// as null). Any other type throws ReportError naming file, line and key.
double number(const Line& line, const char* key, const std::string& path);
/// Field `key` as a string; `fallback` when absent. Another type throws like number().
std::string text(const Line& line, const char* key, const std::string& path, const std::string& fallback = "");

}  // namespace lt::report::detail
