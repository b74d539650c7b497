#pragma once
// gnuplot as a subprocess: the script and its data files are written into the staging
// folder, and gnuplot runs there (no shell), so every path in a script is relative.
#include <string>
#include <utility>
#include <vector>

namespace lt::report::detail {

/// Runs `program script` with `dir` as its working directory, stdin from /dev/null and
/// stdout/stderr into `dir`/`log`. Throws ReportError when `program` cannot be found
/// (naming the Debian package gnuplot-nox), std::runtime_error with the end of the log when
/// gnuplot fails.
void run_gnuplot(const std::string& program, const std::string& dir, const std::string& script,
                 const std::string& log);

/// The gnuplot program to run: $LEANTRAIN_GNUPLOT when set, else `configured`.
std::string gnuplot_program(const std::string& configured);

/// A gnuplot string literal ('...' with ' doubled): names and titles are user text.
std::string quote(const std::string& s);

/// A number as gnuplot and the data files read it ("%.17g", finite values only).
std::string num(double v);

/// Starts one PNG in a script: reset, pngcairo terminal of `width` x `height`, output file.
/// Text is noenhanced: names with '_' must not turn into subscripts.
std::string begin_png(const std::string& png, int width, int height, const std::string& title);

/// Two-column data ("x y" per line) from the pairs whose y is finite.
std::string xy_data(const std::vector<std::pair<double, double>>& points);

}  // namespace lt::report::detail
