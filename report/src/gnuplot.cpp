#include "gnuplot.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "leantrain/report/report.h"
#include "leantrain/runtime/files.h"

extern char** environ;

namespace lt::report::detail {

std::string gnuplot_program(const std::string& configured) {
  const char* env = std::getenv("LEANTRAIN_GNUPLOT");
  return env && *env ? env : configured;
}

// Note [gnuplot without a shell]: posix_spawnp runs gnuplot directly (no /bin/sh, so no
// quoting of paths), in the staging folder (addchdir_np, glibc >= 2.29), and, unlike
// fork(), is safe in a process whose other threads (LibTorch's pools) hold locks. A missing
// program is reported by posix_spawnp itself as ENOENT, before anything runs.
void run_gnuplot(const std::string& program, const std::string& dir, const std::string& script,
                 const std::string& log) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addchdir_np(&actions, dir.c_str());
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  std::vector<std::string> args = {program, script};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc == ENOENT || rc == EACCES)
    throw ReportError("cannot run " + program + " (" + std::strerror(rc) +
                      "): the plots are drawn by gnuplot; install the Debian package gnuplot-nox "
                      "(apt-get install gnuplot-nox, or scripts/setup.sh) or set LEANTRAIN_GNUPLOT");
  if (rc != 0) throw std::runtime_error("cannot start " + program + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error("waiting for " + program + ": " + std::strerror(errno));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return;
  // posix_spawnp may report a failed exec only through the child's exit status 127.
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw ReportError("cannot run " + program +
                      ": the plots are drawn by gnuplot; install the Debian package gnuplot-nox "
                      "(apt-get install gnuplot-nox, or scripts/setup.sh) or set LEANTRAIN_GNUPLOT");
  std::ifstream in(files::join(dir, log));
  std::stringstream ss;
  ss << in.rdbuf();
  std::string tail = ss.str();
  if (tail.size() > 2000) tail = "..." + tail.substr(tail.size() - 2000);
  const std::string how = WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                            : "signal " + std::to_string(WTERMSIG(status));
  throw std::runtime_error(program + " failed (" + how + ") on " + files::join(dir, script) + ":\n" + tail);
}

std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (c == '\n' || c == '\r') out += ' ';
    else out += c;
  }
  return out + "'";
}

std::string num(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string begin_png(const std::string& png, int width, int height, const std::string& title) {
  return "reset\nset terminal pngcairo size " + std::to_string(width) + "," + std::to_string(height) +
         " noenhanced font 'sans,10'\nset output " + quote(png) + "\nset title " + quote(title) +
         " font 'sans,12'\nset grid lc rgb '#dddddd'\nset key outside right top vertical box lc rgb '#cccccc'\nset autoscale xfix\n"
         "set border lc rgb '#555555'\n";
}

std::string xy_data(const std::vector<std::pair<double, double>>& points) {
  std::string out;
  for (const auto& [x, y] : points)
    if (std::isfinite(x) && std::isfinite(y)) out += num(x) + " " + num(y) + "\n";
  return out;
}

}  // namespace lt::report::detail
