// `leantrain report --bench BENCH.jsonl --out DIR`: benchmark results -> one horizontal bar
// chart per metric and index.html with the table (format: docs/REPORT.md).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "gnuplot.h"
#include "html.h"
#include "jsonl.h"
#include "leantrain/report/report.h"
#include "leantrain/runtime/files.h"
#include "staging.h"

namespace lt::report {
namespace {

struct Entry {
  std::string bench, row, metric;
  double value, baseline;
};

std::vector<Entry> read_bench(const std::string& path, std::vector<std::string>& warnings) {
  std::vector<Entry> out;
  for (const auto& l : detail::read_jsonl(path, warnings)) {
    auto need = [&](const char* key) {
      if (!l.value.contains(key))
        throw ReportError(path + ":" + std::to_string(l.number) + ": missing \"" + key +
                          "\" (each line: {\"bench\", \"row\", \"metric\", \"value\", \"baseline\" optional})");
    };
    for (const char* k : {"bench", "row", "metric", "value"}) need(k);
    out.push_back({detail::text(l, "bench", path), detail::text(l, "row", path), detail::text(l, "metric", path),
                   detail::number(l, "value", path), detail::number(l, "baseline", path)});
  }
  if (out.empty()) throw ReportError(path + ": no results (expected one JSON object per line)");
  return out;
}

// A file name from a metric name: [A-Za-z0-9_.-] kept, anything else '_'.
std::string file_stem(const std::string& metric) {
  std::string s;
  for (char c : metric) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  if (s.empty() || s[0] == '.') s = "metric" + s;
  return s;
}

const char* kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Chart {
  std::string png, metric;
  bool ratio;
};

}  // namespace

Result render_bench(const std::string& bench_jsonl, const std::string& out_dir, const Options& options) {
  if (out_dir.empty()) throw ReportError("report --bench needs --out DIR");
  Result res;
  const std::vector<Entry> all = read_bench(bench_jsonl, res.warnings);
  res.out_dir = out_dir;

  // Metrics in order of first appearance; within one, entries grouped by bench (benches in
  // order of first appearance), rows in file order.
  std::vector<std::string> metrics, benches;
  for (const auto& e : all) {
    if (std::find(metrics.begin(), metrics.end(), e.metric) == metrics.end()) metrics.push_back(e.metric);
    if (std::find(benches.begin(), benches.end(), e.bench) == benches.end()) benches.push_back(e.bench);
  }
  detail::Staging stage(out_dir);
  std::string script;
  std::vector<Chart> charts;
  std::map<std::string, int> stems;
  for (size_t m = 0; m < metrics.size(); ++m) {
    std::vector<const Entry*> es;
    for (const auto& b : benches)
      for (const auto& e : all)
        if (e.metric == metrics[m] && e.bench == b) es.push_back(&e);
    // Note [Ratio or value]: a metric is drawn as value/baseline only when every line of it
    // has a finite baseline; a mixed chart would put ratios and raw numbers on one axis.
    bool ratio = true;
    for (const auto* e : es) ratio = ratio && std::isfinite(e->baseline) && e->baseline != 0;
    auto shown = [&](const Entry& e) { return ratio ? e.value / e.baseline : e.value; };
    std::string stem = file_stem(metrics[m]);
    if (stems[stem]++ > 0) stem += "_" + std::to_string(stems[stem]);
    const std::string png = stem + ".png";

    // Top to bottom in file order: y = n-1 ... 0.
    const int n = static_cast<int>(es.size());
    double lo = 0, hi = ratio ? 1.0 : 0;
    std::string ytics, plot;
    std::map<std::string, std::string> per_bench;
    // A row label that several benches share is prefixed by its bench (colour alone is
    // not enough to read the chart).
    std::map<std::string, int> row_count;
    for (const auto* e : es) ++row_count[e->row];
    for (int i = 0; i < n; ++i) {
      const Entry& e = *es[i];
      const int y = n - 1 - i;
      const std::string label = row_count[e.row] > 1 ? e.bench + ": " + e.row : e.row;
      ytics += std::string(ytics.empty() ? "" : ", ") + detail::quote(label) + " " + std::to_string(y);
      const double v = shown(e);
      if (!std::isfinite(v)) continue;  // null values are listed in the table only
      lo = std::min(lo, v);
      hi = std::max(hi, v);
      per_bench[e.bench] += detail::num(v) + " " + std::to_string(y) + " " +
                            (ratio ? detail::sig(v, 3) + "x" : detail::sig(v, 4)) + "\n";
    }
    const double pad = 0.15 * (hi - lo > 0 ? hi - lo : 1.0);
    const int height = std::max(260, 110 + 26 * n);
    script += detail::begin_png(png, 900, height,
                                metrics[m] + (ratio ? ": value / baseline" : ""));
    script += "set xlabel " + detail::quote(ratio ? metrics[m] + " / baseline (1.0 = the baseline)" : metrics[m]) + "\n";
    script += "set xrange [" + detail::num(lo < 0 ? lo - pad : 0) + ":" + detail::num(hi + pad) + "]\n";
    script += "set yrange [-0.7:" + detail::num(n - 0.3) + "]\nset ytics (" + ytics + ") nomirror\n"
              "set grid noytics xtics\nset style textbox opaque noborder\n";
    if (ratio) script += "set arrow from 1, graph 0 to 1, graph 1 nohead dt 2 lw 1.5 lc rgb '#000000' back\n";
    for (size_t b = 0; b < benches.size(); ++b) {
      const auto it = per_bench.find(benches[b]);
      if (it == per_bench.end()) continue;
      const std::string file = detail::quote("gnuplot/" + stem + "_" + std::to_string(b) + ".dat");
      stage.write("gnuplot/" + stem + "_" + std::to_string(b) + ".dat", it->second);
      plot += std::string(plot.empty() ? "" : ", ") + file +
              " using ($1/2):2:(0):1:($2-0.38):($2+0.38) with boxxyerror fs solid 0.8 noborder lc rgb '" +
              kColours[b % 10] + "' title " + detail::quote(benches[b]) + ", " + file +
              " using 1:2:3 with labels left offset 0.5,0 boxed font 'sans,9' notitle";
    }
    if (plot.empty()) {
      res.omitted.push_back(png + ": no finite value");
      continue;
    }
    script += "plot " + plot + "\n";
    charts.push_back({png, metrics[m], ratio});
  }
  if (!charts.empty()) {
    stage.write("gnuplot/plots.gp", "# Drawn by `leantrain report --bench`; rerun from this folder: gnuplot gnuplot/plots.gp\n" +
                                        script);
    detail::run_gnuplot(detail::gnuplot_program(options.gnuplot), stage.dir(), "gnuplot/plots.gp", "gnuplot/log.txt");
  }

  std::string body;
  for (const auto& w : res.warnings) body += "<p class=\"warn\">" + detail::escape(w) + "</p>\n";
  body += "<p>From " + detail::escape(bench_jsonl) + ": " + std::to_string(all.size()) + " results, " +
          std::to_string(metrics.size()) + " metrics.</p>\n";
  std::vector<std::vector<std::string>> rows;
  for (const auto& e : all) {
    const bool has_base = std::isfinite(e.baseline);
    rows.push_back({detail::escape(e.bench), detail::escape(e.row), detail::escape(e.metric), detail::sig(e.value, 6),
                    has_base ? detail::sig(e.baseline, 6) : "",
                    has_base && e.baseline != 0 ? detail::sig(e.value / e.baseline, 4) : ""});
  }
  body += "<h2>Results</h2>\n" + detail::table({"bench", "row", "metric", "value", "baseline", "value / baseline"}, rows);
  body += "<h2>Plots</h2>\n";
  for (const auto& c : charts)
    body += detail::figure(c.png, c.metric + (c.ratio ? ": value / baseline (dashed line: 1.0)" : ""));
  for (const auto& o : res.omitted) body += "<p class=\"omitted\">" + detail::escape(o) + "</p>\n";
  stage.write("index.html", detail::page("leantrain benchmark " + bench_jsonl, body));
  stage.commit();
  for (const auto& c : charts) res.plots.push_back(c.png);
  return res;
}

}  // namespace lt::report
