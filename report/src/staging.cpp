#include "staging.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <vector>

#include "leantrain/report/report.h"
#include "leantrain/runtime/files.h"

namespace lt::report::detail {
namespace {

std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string make_temp_dir(const std::string& prefix) {
  std::vector<char> name(prefix.begin(), prefix.end());
  for (char c : std::string("XXXXXX")) name.push_back(c);
  name.push_back('\0');
  if (!::mkdtemp(name.data()))
    throw std::runtime_error("cannot create directory " + prefix + "XXXXXX: " + std::strerror(errno));
  ::chmod(name.data(), 0755);  // mkdtemp makes it 0700; a report is for others to read
  return name.data();
}

// Every report folder holds this file; a folder without it (and without the gnuplot script
// of a report written before the marker existed) is somebody else's and is not replaced.
constexpr const char* kMarker = ".leantrain-report";

bool is_replaceable(const std::string& dir) {
  if (!files::exists(dir)) return true;
  return files::list_dir(dir).empty() || files::exists(files::join(dir, kMarker)) ||
         files::exists(files::join(dir, "gnuplot/plots.gp"));
}

void refuse_foreign(const std::string& out) {
  if (!is_replaceable(out))
    throw ReportError("cannot write the report to " + out +
                      ": that folder holds files that are not a leantrain report (a report replaces its "
                      "whole folder); give --out a new or empty folder");
}

}  // namespace

Staging::Staging(const std::string& out) : out_(out) {
  while (out_.size() > 1 && out_.back() == '/') out_.pop_back();
  if (files::exists(out_) && !files::is_directory(out_))
    throw std::runtime_error("cannot write the report to " + out_ + ": a file is in the way");
  refuse_foreign(out_);
  files::make_dirs(parent_of(out_));
  dir_ = make_temp_dir(out_ + ".tmp-");
  write(kMarker, "written by leantrain report; this folder is replaced as a whole when the report is redrawn\n");
}

Staging::~Staging() {
  if (!committed_) files::remove_tree(dir_);
}

void Staging::write(const std::string& name, const std::string& content) const {
  const std::string path = files::join(dir_, name);
  files::make_dirs(parent_of(path));
  std::ofstream f(path, std::ios::binary);
  f << content;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A previous report is first moved aside (rename over an empty folder made for it), so the
// new one is renamed into a free name; the old one is deleted only after that succeeded.
void Staging::commit() {
  refuse_foreign(out_);  // again: something may have been put there while gnuplot drew
  std::string old;
  if (files::exists(out_)) {
    old = make_temp_dir(out_ + ".old-");
    if (::rename(out_.c_str(), old.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      files::remove_tree(old);
      throw std::runtime_error("cannot replace " + out_ + ": " + why);
    }
  }
  if (::rename(dir_.c_str(), out_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (!old.empty()) ::rename(old.c_str(), out_.c_str());
    throw std::runtime_error("cannot rename " + dir_ + " to " + out_ + ": " + why);
  }
  committed_ = true;
  if (!old.empty()) files::remove_tree(old);
}

}  // namespace lt::report::detail
