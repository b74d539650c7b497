#pragma once
// Renders metrics into PNG plots (drawn by gnuplot, run as a subprocess) and a one-page HTML
// summary (docs/REPORT.md). Torch-free: benchmarks and tools link it without LibTorch.
//
//   auto r = lt::report::render_run("runs/demo");        // runs/demo/report/index.html
//   auto b = lt::report::render_bench("bench.jsonl", "bench_report");
//
// Every output appears at once: the files are written into `<out>.tmp-XXXXXX` beside the
// output folder and renamed into place when gnuplot has drawn every plot, so a failed or
// interrupted report leaves the previous report (if any) and no half-written folder.
#include <string>
#include <vector>

#include "leantrain/runtime/errors.h"

namespace lt::report {

/// Bad input (missing run folder or file, a malformed line, a missing field) or gnuplot
/// missing: the command line exits 2 with this message (one line, naming the file and line
/// or the Debian package to install). Declared in runtime/errors.h, beside the table.
using ReportError = ::lt::ReportError;

struct Options {
  /// gnuplot to run (found on PATH when it has no '/'); the environment variable
  /// LEANTRAIN_GNUPLOT overrides it.
  std::string gnuplot = "gnuplot";
};

struct Result {
  std::string out_dir;                ///< the folder written (holds index.html)
  std::vector<std::string> plots;     ///< PNG file names drawn, relative to out_dir
  std::vector<std::string> omitted;   ///< "name.png: why" for each plot left out
  std::vector<std::string> warnings;  ///< e.g. a truncated last line that was skipped
};

/// Renders `run_dir`/metrics.jsonl (README.md, "Metrics file") and, when present,
/// `run_dir`/config.json into `out_dir` (default `run_dir`/report): loss.png,
/// samples_per_s.png, peak_memory.png, loss_scale.png, eval.png — each only when the run
/// has its data — and index.html. Throws ReportError on bad input or a missing gnuplot,
/// std::runtime_error when gnuplot fails or a file cannot be written.
Result render_run(const std::string& run_dir, const std::string& out_dir = "", const Options& options = {});

/// Renders a benchmark results file: one JSON object per line,
///   {"bench": "<name>", "row": "<label>", "metric": "<name>", "value": number,
///    "baseline": number (optional)}
/// as one horizontal bar chart per metric (bars grouped and coloured by bench; the ratio
/// value/baseline with a line at 1.0 when every line of that metric has a baseline) plus
/// index.html with the full table. Same errors as render_run.
Result render_bench(const std::string& bench_jsonl, const std::string& out_dir, const Options& options = {});

}  // namespace lt::report
