// Text corpus reader. Torch-free: see readers.h.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "leantrain/data/readers.h"
#include "leantrain/runtime/errors.h"

namespace lt::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string read_file(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw lt::DataError("cannot read text file '" + file + "': " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw lt::DataError("error reading text file '" + file + "'");
  return ss.str();
}

}  // namespace

std::string read_text_corpus(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw lt::DataError("text corpus '" + path + "' does not exist");
  }
  std::string out;
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    if (dir == nullptr) {
      throw lt::DataError("cannot open text corpus directory '" + path + "': " + std::strerror(errno));
    }
    std::vector<std::string> names;
    while (dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name.empty() || name[0] == '.' || ends_with(name, ".dat") || ends_with(name, ".u8")) continue;
      names.push_back(name);
    }
    ::closedir(dir);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      const std::string file = path + (ends_with(path, "/") ? "" : "/") + name;
      struct stat fst {};
      if (::stat(file.c_str(), &fst) != 0 || !S_ISREG(fst.st_mode)) continue;  // subdirs, dangling links
      out += read_file(file);
    }
  } else {
    out = read_file(path);
  }
  if (out.empty()) throw lt::DataError("text corpus '" + path + "' is empty");
  return out;
}

}  // namespace lt::data
