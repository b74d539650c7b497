#include "jsonl.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include "leantrain/report/report.h"
#include "leantrain/runtime/files.h"

namespace lt::report::detail {

// Note [Truncated last line]: MetricsWriter writes each line whole and flushes it, so a
// killed run can leave at most a partial last line, and that line has no newline. Such a
// line is the one thing skipped (with a warning); a bad line anywhere else, or a bad last
// line that was written completely, is an error naming its line number.
std::vector<Line> read_jsonl(const std::string& path, std::vector<std::string>& warnings) {
  if (!files::exists(path)) throw ReportError(path + ": no such file");
  if (files::is_directory(path)) throw ReportError(path + ": is a directory, not a JSON-lines file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ReportError(path + ": cannot be read");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();

  std::vector<Line> out;
  size_t pos = 0;
  int64_t number = 0;
  while (pos < all.size()) {
    const size_t nl = all.find('\n', pos);
    const bool complete = nl != std::string::npos;
    const std::string text = all.substr(pos, complete ? nl - pos : std::string::npos);
    pos = complete ? nl + 1 : all.size();
    ++number;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    std::string why;
    try {
      j = nlohmann::json::parse(text);
      if (!j.is_object()) why = "not a JSON object";
    } catch (const nlohmann::json::parse_error& e) {
      why = std::string("malformed JSON (") + e.what() + ")";
    }
    if (why.empty()) {
      out.push_back({number, std::move(j)});
    } else if (!complete) {
      warnings.push_back(path + ":" + std::to_string(number) +
                         ": skipped a truncated last line (the writer was stopped mid-line)");
    } else {
      throw ReportError(path + ":" + std::to_string(number) + ": " + why);
    }
  }
  return out;
}

namespace {

[[noreturn]] void wrong_type(const Line& line, const char* key, const std::string& path, const char* want) {
  throw ReportError(path + ":" + std::to_string(line.number) + ": \"" + key + "\" must be " + want + ", got " +
                    line.value.at(key).dump());
}

}  // namespace

double number(const Line& line, const char* key, const std::string& path) {
  const auto it = line.value.find(key);
  if (it == line.value.end() || it->is_null()) return std::numeric_limits<double>::quiet_NaN();
  if (!it->is_number()) wrong_type(line, key, path, "a number or null");
  return it->get<double>();
}

std::string text(const Line& line, const char* key, const std::string& path, const std::string& fallback) {
  const auto it = line.value.find(key);
  if (it == line.value.end()) return fallback;
  if (!it->is_string()) wrong_type(line, key, path, "a string");
  return it->get<std::string>();
}

}  // namespace lt::report::detail
