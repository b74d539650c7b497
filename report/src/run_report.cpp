// `leantrain report RUN_DIR`: metrics.jsonl (+ config.json) -> plots and index.html.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "gnuplot.h"
#include "html.h"
#include "jsonl.h"
#include "leantrain/report/report.h"
#include "leantrain/runtime/files.h"
#include "staging.h"

namespace lt::report {
namespace {

using detail::Line;
using Points = std::vector<std::pair<double, double>>;
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct StepRow {
  double loss = kNaN, lr = kNaN, loss_scale = kNaN, samples_per_s = kNaN, tokens_per_s = kNaN;
  double peak = kNaN, params = kNaN, grads = kNaN, optimizer = kNaN, activations = kNaN, comm_buffers = kNaN,
         other = kNaN;
  double micro_batch = kNaN, accumulation = kNaN;
};

struct EpochRow {
  double epoch = kNaN, step = kNaN, eval_loss = kNaN, eval_accuracy = kNaN, eval_perplexity = kNaN;
  double epoch_time_s = kNaN, samples_per_s = kNaN, peak = kNaN;
};

struct Marker {
  int64_t step;
  std::string what;
};

struct RunData {
  // Keyed by step: a resumed run appends to its metrics and a step logged twice keeps its
  // last value (as tests/integration/cli_fixture.h reads it).
  std::map<int64_t, StepRow> steps;
  std::map<int64_t, EpochRow> epochs;
  std::vector<Marker> skipped, backoffs, resumes;
  int64_t checkpoints = 0;
  double checkpoint_seconds = 0, checkpoint_stall_s = 0, checkpoint_bytes = kNaN;
  std::optional<nlohmann::json> plan;
};

RunData read_metrics(const std::string& path, std::vector<std::string>& warnings) {
  using detail::number;
  RunData d;
  for (const Line& l : detail::read_jsonl(path, warnings)) {
    const auto ev = l.value.find("event");
    if (ev == l.value.end() || !ev->is_string())
      throw ReportError(path + ":" + std::to_string(l.number) + ": no \"event\" string in " + l.value.dump());
    const std::string kind = ev->get<std::string>();
    auto step_of = [&] {
      const double s = number(l, "step", path);
      if (!std::isfinite(s))
        throw ReportError(path + ":" + std::to_string(l.number) + ": a \"" + kind + "\" event needs a \"step\" number");
      return static_cast<int64_t>(s);
    };
    if (kind == "step") {
      static const std::pair<double StepRow::*, const char*> kFields[] = {
          {&StepRow::loss, "loss"},
          {&StepRow::lr, "lr"},
          {&StepRow::loss_scale, "loss_scale"},
          {&StepRow::samples_per_s, "samples_per_s"},
          {&StepRow::tokens_per_s, "tokens_per_s"},
          {&StepRow::peak, "peak_mem_bytes"},
          {&StepRow::params, "mem_params_bytes"},
          {&StepRow::grads, "mem_grads_bytes"},
          {&StepRow::optimizer, "mem_optimizer_bytes"},
          {&StepRow::activations, "mem_activations_bytes"},
          {&StepRow::comm_buffers, "mem_comm_buffers_bytes"},
          {&StepRow::other, "mem_other_bytes"},
          {&StepRow::micro_batch, "micro_batch"},
          {&StepRow::accumulation, "accumulation"}};
      StepRow r;
      for (const auto& [field, key] : kFields) r.*field = number(l, key, path);
      d.steps[step_of()] = r;
    } else if (kind == "epoch") {
      static const std::pair<double EpochRow::*, const char*> kFields[] = {
          {&EpochRow::epoch, "epoch"},
          {&EpochRow::step, "step"},
          {&EpochRow::eval_loss, "eval_loss"},
          {&EpochRow::eval_accuracy, "eval_accuracy"},
          {&EpochRow::eval_perplexity, "eval_perplexity"},
          {&EpochRow::epoch_time_s, "epoch_time_s"},
          {&EpochRow::samples_per_s, "samples_per_s"},
          {&EpochRow::peak, "peak_mem_bytes"}};
      EpochRow r;
      for (const auto& [field, key] : kFields) r.*field = number(l, key, path);
      if (!std::isfinite(r.epoch))
        throw ReportError(path + ":" + std::to_string(l.number) + ": an \"epoch\" event needs an \"epoch\" number");
      d.epochs[static_cast<int64_t>(r.epoch)] = r;
    } else if (kind == "skipped_step") {
      d.skipped.push_back({step_of(), detail::text(l, "reason", path, "skipped")});
    } else if (kind == "oom_backoff") {
      auto i = [&](const char* k) { return detail::sig(number(l, k, path), 12); };
      d.backoffs.push_back({step_of(), "micro-batch " + i("old_micro_batch") + " × " + i("old_accumulation") +
                                           " → " + i("new_micro_batch") + " × " + i("new_accumulation")});
    } else if (kind == "resume") {
      d.resumes.push_back({step_of(), detail::text(l, "path", path)});
    } else if (kind == "checkpoint") {
      ++d.checkpoints;
      const double s = number(l, "seconds", path), stall = number(l, "stall_s", path);
      if (std::isfinite(s)) d.checkpoint_seconds += s;
      if (std::isfinite(stall)) d.checkpoint_stall_s += stall;
      d.checkpoint_bytes = number(l, "bytes", path);
    } else if (kind == "plan") {
      d.plan = l.value;
    }
    // Other events (from newer versions) are not drawn.
  }
  return d;
}

std::optional<nlohmann::json> read_config(const std::string& path) {
  if (!files::exists(path)) return std::nullopt;
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    auto j = nlohmann::json::parse(ss.str());
    if (!j.is_object()) throw ReportError(path + ": not a JSON object");
    return j;
  } catch (const nlohmann::json::parse_error& e) {
    throw ReportError(path + ": malformed JSON (" + e.what() + ")");
  }
}

// config.json value at "section.key" as display text; "" when absent.
std::string config_text(const std::optional<nlohmann::json>& cfg, const char* section, const char* key) {
  if (!cfg || !cfg->contains(section) || !(*cfg)[section].is_object() || !(*cfg)[section].contains(key)) return "";
  const auto& v = (*cfg)[section][key];
  return v.is_string() ? v.get<std::string>() : v.dump();
}

double config_number(const std::optional<nlohmann::json>& cfg, const char* section, const char* key) {
  if (!cfg || !cfg->contains(section) || !(*cfg)[section].is_object()) return kNaN;
  const auto it = (*cfg)[section].find(key);
  return it != (*cfg)[section].end() && it->is_number() ? it->get<double>() : kNaN;
}

std::string model_text(const std::optional<nlohmann::json>& cfg) {
  const std::string kind = config_text(cfg, "model", "kind");
  auto c = [&](const char* k) { return config_text(cfg, "model", k); };
  if (kind == "gpt" || kind == "bert")
    return kind + " (" + c("n_layer") + " layers, d_model " + c("d_model") + ", " + c("n_head") + " heads, seq_len " +
           c("seq_len") + ", vocab " + c("vocab_size") + ")";
  if (kind == "resnet") {
    const std::string layers = c("layers");
    return kind + " (" + (layers.empty() || layers == "[]" ? "depth " + c("depth") : "layers " + layers) + ", " +
           c("block") + " blocks, width " + c("width") + ")";
  }
  if (kind == "mlp") return kind + " (hidden " + c("hidden") + ")";
  return kind;
}

// Note [Memory axis unit]: one unit for the whole axis, the largest binary unit the peak
// reaches, so a tiny CPU test run reads in KiB and a GPU run in GiB.
std::pair<double, std::string> memory_unit(double max_bytes) {
  if (max_bytes >= 1024.0 * 1024 * 1024) return {1024.0 * 1024 * 1024, "GiB"};
  if (max_bytes >= 1024.0 * 1024) return {1024.0 * 1024, "MiB"};
  if (max_bytes >= 1024.0) return {1024.0, "KiB"};
  return {1.0, "bytes"};
}

struct Plot {
  std::string png, caption;
};

class RunReport {
 public:
  RunReport(const RunData& d, const detail::Staging& stage) : d_(d), stage_(stage) {}

  void draw_all() {
    loss();
    samples_per_s();
    peak_memory();
    loss_scale();
    eval();
  }

  const std::string& script() const { return script_; }
  const std::vector<Plot>& plots() const { return plots_; }
  const std::vector<std::string>& omitted() const { return omitted_; }
  // Every plot and omission in drawing order, for the page.
  const std::vector<std::pair<std::string, std::string>>& sections() const { return sections_; }

 private:
  Points series(double StepRow::*field) const {
    Points p;
    for (const auto& [s, r] : d_.steps)
      if (std::isfinite(r.*field)) p.push_back({static_cast<double>(s), r.*field});
    return p;
  }

  std::string data(const std::string& name, const std::string& content) {
    const std::string rel = "gnuplot/" + name;
    stage_.write(rel, content);
    return detail::quote(rel);
  }

  void add(const std::string& png, const std::string& caption) {
    plots_.push_back({png, caption});
    sections_.push_back({png, caption});
  }

  void omit(const std::string& png, const std::string& why) {
    omitted_.push_back(png + ": " + why);
    sections_.push_back({"", png + " is not drawn: " + why});
  }

  // Vertical dashed lines at marked steps, with one legend entry each kind.
  std::string markers(const std::vector<Marker>& m, const char* colour, const std::string& title,
                      std::string& legend) {
    if (m.empty()) return "";
    std::string out;
    for (const auto& k : m)
      out += "set arrow from " + std::to_string(k.step) + ", graph 0 to " + std::to_string(k.step) +
             ", graph 1 nohead dt 2 lw 1.5 lc rgb '" + colour + "' back\n";
    legend += ", NaN with lines dt 2 lw 1.5 lc rgb '" + std::string(colour) + "' title " + detail::quote(title);
    return out;
  }

  static std::string style(size_t n) { return n <= 60 ? "linespoints pt 7 ps 0.5" : "lines"; }

  // The x axis of a per-step plot; one step gets room around it (gnuplot cannot autoscale
  // a single x).
  std::string step_axis() const {
    std::string out = "set xlabel 'optimizer step'\n";
    if (d_.steps.size() == 1) {
      const int64_t s = d_.steps.begin()->first;
      out += "set xrange [" + std::to_string(s - 1) + ":" + std::to_string(s + 1) + "]\nset xtics 1\n";
    }
    return out;
  }

  // Why a per-step plot has nothing to draw.
  std::string no_step_data(const char* field) const {
    return d_.steps.empty() ? "no step events" : std::string("no step event has a finite ") + field;
  }

  void loss() {
    const Points p = series(&StepRow::loss);
    if (p.empty()) return omit("loss.png", no_step_data("loss"));
    std::string legend;
    script_ += detail::begin_png("loss.png", 900, 400, "Training loss per step");
    script_ += step_axis() + "set ylabel 'loss (mean over the global batch)'\n";
    script_ += markers(d_.skipped, "#d62728", "skipped step (" + std::to_string(d_.skipped.size()) + ")", legend);
    script_ += markers(d_.backoffs, "#ff7f0e", "OOM back-off (" + std::to_string(d_.backoffs.size()) + ")",
                       legend);
    script_ += "plot " + data("loss.dat", detail::xy_data(p)) + " using 1:2 with " + style(p.size()) +
               " lw 1.5 lc rgb '#1f77b4' title 'loss'" + legend + "\n";
    add("loss.png", "Training loss per step" +
                        std::string(d_.skipped.empty() && d_.backoffs.empty()
                                        ? ""
                                        : " (dashed lines: skipped steps in red, out-of-memory back-offs in orange)"));
  }

  void samples_per_s() {
    const Points p = series(&StepRow::samples_per_s);
    if (p.empty()) return omit("samples_per_s.png", no_step_data("samples_per_s"));
    double sum = 0;
    for (size_t i = p.size() > 1 ? 1 : 0; i < p.size(); ++i) sum += p[i].second;
    const double mean = sum / static_cast<double>(p.size() > 1 ? p.size() - 1 : 1);
    script_ += detail::begin_png("samples_per_s.png", 900, 400, "Throughput per step");
    script_ += step_axis() + "set ylabel 'samples/s (global batch / step time)'\nset yrange [0:*]\n";
    script_ += "plot " + data("samples_per_s.dat", detail::xy_data(p)) + " using 1:2 with " + style(p.size()) +
               " lw 1.5 lc rgb '#2ca02c' title 'samples/s', " + detail::num(mean) +
               " with lines dt 2 lc rgb '#555555' title " +
               detail::quote("mean " + detail::sig(mean) + (p.size() > 1 ? " (without step 1)" : "")) + "\n";
    add("samples_per_s.png", "Samples per second per step; the dashed line is the mean without the first step");
  }

  // Stacked areas (params, grads, optimizer, comm buffers, other, activations: they add up to the
  // peak, README "Metrics file") under the measured peak as a line.
  void peak_memory() {
    const Points peak = series(&StepRow::peak);
    if (peak.empty()) return omit("peak_memory.png", no_step_data("peak_mem_bytes"));
    double max_bytes = 0;
    for (const auto& [s, v] : peak) max_bytes = std::max(max_bytes, v);
    const auto [div, unit] = memory_unit(max_bytes);
    struct Part {
      double StepRow::*field;
      const char* title;
      const char* colour;
    };
    const std::vector<Part> all = {{&StepRow::params, "parameters", "#1f77b4"},
                                   {&StepRow::grads, "gradients", "#ff7f0e"},
                                   {&StepRow::optimizer, "optimizer state", "#2ca02c"},
                                   {&StepRow::comm_buffers, "grad buckets", "#9467bd"},
                                   {&StepRow::other, "other (buffers, batch, checkpoint snapshot)", "#7f7f7f"},
                                   {&StepRow::activations, "activations", "#d62728"}};
    std::vector<Part> parts;
    for (const auto& part : all) {
      bool any = false;
      for (const auto& [s, r] : d_.steps) any = any || (std::isfinite(r.*part.field) && r.*part.field > 0);
      if (any) parts.push_back(part);
    }
    // Columns: step, then the running sums of the parts (missing parts count as 0).
    std::string table;
    for (const auto& [s, r] : d_.steps) {
      if (!std::isfinite(r.peak)) continue;
      table += std::to_string(s);
      double sum = 0;
      for (const auto& part : parts) {
        if (std::isfinite(r.*part.field)) sum += r.*part.field;
        table += " " + detail::num(sum / div);
      }
      table += "\n";
    }
    Points peak_scaled;
    for (const auto& [s, v] : peak) peak_scaled.push_back({s, v / div});
    const std::string stack = data("memory_breakdown.dat", table);
    script_ += detail::begin_png("peak_memory.png", 900, 400, "Peak memory per step (this rank)");
    script_ += step_axis() + "set ylabel 'memory (" + unit + ")'\nset yrange [0:*]\n";
    script_ += "plot ";
    // Drawn top-down: each area covers the ones above it from 0 to its own running sum.
    for (size_t i = parts.size(); i-- > 0;)
      script_ += stack + " using 1:" + std::to_string(i + 2) + " with filledcurves x1 fs solid 0.55 noborder lc rgb '" +
                 parts[i].colour + "' title " + detail::quote(parts[i].title) + ", ";
    script_ += data("peak.dat", detail::xy_data(peak_scaled)) +
               " using 1:2 with lines lw 2 lc rgb '#000000' title 'peak'\n";
    add("peak_memory.png", "Peak memory per step, stacked by what holds it (" + unit + ")");
  }

  void loss_scale() {
    Points p;
    bool scaled = false;
    for (const auto& [s, r] : d_.steps)
      if (std::isfinite(r.loss_scale) && r.loss_scale > 0) {
        p.push_back({static_cast<double>(s), r.loss_scale});
        scaled = scaled || r.loss_scale != 1.0;
      }
    if (p.empty()) return omit("loss_scale.png", no_step_data("loss_scale"));
    if (!scaled)
      return omit("loss_scale.png", "the loss scale is 1 at every step (no fp16 loss scaling in this run)");
    std::string legend;
    script_ += detail::begin_png("loss_scale.png", 900, 400, "fp16 loss scale per step");
    script_ += step_axis() + "set ylabel 'loss scale (log scale)'\nset logscale y 2\n"
               "set format y '%.0f'\n";
    script_ += markers(d_.skipped, "#d62728", "skipped step (" + std::to_string(d_.skipped.size()) + ")", legend);
    script_ += "plot " + data("loss_scale.dat", detail::xy_data(p)) + " using 1:2 with steps lw 1.5 lc rgb '#9467bd'" +
               " title 'loss scale used'" + legend + "\n";
    add("loss_scale.png", "Loss scale used at each step (fp16); red dashed lines: skipped steps");
  }

  void eval() {
    if (d_.epochs.empty()) return omit("eval.png", "no epoch events (the run ended before its first evaluation)");
    struct Panel {
      double EpochRow::*field;
      double factor;
      const char* title;
      const char* ylabel;
      const char* colour;
    };
    const std::vector<Panel> all = {{&EpochRow::eval_accuracy, 100.0, "eval accuracy", "accuracy (%)", "#2ca02c"},
                                    {&EpochRow::eval_loss, 1.0, "eval loss", "loss", "#1f77b4"},
                                    {&EpochRow::eval_perplexity, 1.0, "eval perplexity", "perplexity", "#9467bd"}};
    std::vector<std::pair<Panel, Points>> panels;
    double lo = 1e300, hi = -1e300;
    for (const auto& panel : all) {
      Points p;
      for (const auto& [e, r] : d_.epochs)
        if (std::isfinite(r.*panel.field)) {
          p.push_back({static_cast<double>(e + 1), r.*panel.field * panel.factor});
          lo = std::min(lo, static_cast<double>(e + 1));
          hi = std::max(hi, static_cast<double>(e + 1));
        }
      if (!p.empty()) panels.push_back({panel, p});
    }
    if (panels.empty()) return omit("eval.png", "the epoch events have no finite eval metric");
    script_ += detail::begin_png("eval.png", 900, 400, "");
    script_ += "set multiplot layout 1," + std::to_string(panels.size()) + " title 'Evaluation after each epoch' font 'sans,12'\n";
    // Whole epochs on x, with room around a single point (gnuplot cannot autoscale one x).
    script_ += "set xrange [" + detail::num(lo - 0.5) + ":" + detail::num(hi + 0.5) + "]\nset xtics 1\n"
               "set xlabel 'epoch'\nunset key\nset offsets 0, 0, graph 0.1, graph 0.1\n";
    for (const auto& [panel, p] : panels) {
      script_ += "set title " + detail::quote(panel.title) + "\nset ylabel " + detail::quote(panel.ylabel) + "\n";
      script_ += "plot " + data("eval_" + std::string(panel.title).substr(5) + ".dat", detail::xy_data(p)) +
                 " using 1:2 with linespoints pt 7 ps 1 lw 1.5 lc rgb '" + panel.colour + "'\n";
    }
    script_ += "unset multiplot\n";
    std::string names;
    for (const auto& [panel, p] : panels) names += (names.empty() ? "" : ", ") + std::string(panel.title);
    add("eval.png", "Per-epoch evaluation: " + names);
  }

  const RunData& d_;
  const detail::Staging& stage_;
  std::string script_;
  std::vector<Plot> plots_;
  std::vector<std::string> omitted_;
  std::vector<std::pair<std::string, std::string>> sections_;
};

std::string summary_html(const RunData& d, const std::optional<nlohmann::json>& cfg, const std::string& run_dir) {
  using detail::escape;
  std::vector<std::pair<std::string, std::string>> rows;
  rows.push_back({"run folder", escape(run_dir)});
  const StepRow* last = d.steps.empty() ? nullptr : &d.steps.rbegin()->second;
  if (cfg) {
    rows.push_back({"model", escape(model_text(cfg))});
    rows.push_back({"precision", escape(config_text(cfg, "precision", "mode"))});
    rows.push_back({"activation recompute", escape(config_text(cfg, "memory", "recompute"))});
    const double every = config_number(cfg, "checkpoint", "every_steps");
    rows.push_back({"checkpoint policy", escape((every > 0 ? "every " + detail::sig(every, 12) + " steps" : "at the end") +
                                                std::string(", keep last ") +
                                                config_text(cfg, "checkpoint", "keep_last") +
                                                (config_text(cfg, "checkpoint", "async") == "true" ? ", background writer"
                                                                                                   : ""))});
    const double global = config_number(cfg, "train", "global_batch");
    // Note [World size from the batch]: config.json has no world size; every step logs its
    // micro-batch and accumulation, and global batch = world x micro-batch x accumulation.
    if (last && std::isfinite(global) && last->micro_batch > 0 && last->accumulation > 0)
      rows.push_back({"world size", escape(detail::sig(global / (last->micro_batch * last->accumulation), 12)) +
                                        " (global batch " + escape(detail::sig(global, 12)) + " = world × micro-batch " +
                                        escape(detail::sig(last->micro_batch, 12)) + " × accumulation " +
                                        escape(detail::sig(last->accumulation, 12)) + ")"});
  } else {
    rows.push_back({"config", "<span class=\"omitted\">config.json not found in the run folder</span>"});
  }
  rows.push_back({"steps", d.steps.empty() ? "0" : std::to_string(d.steps.size()) + " (last step " +
                                                       std::to_string(d.steps.rbegin()->first) + ")"});
  if (last) {
    // "%.6f", as the run's own "done: ... final loss" line prints it.
    rows.push_back({"final loss", std::isfinite(last->loss) ? detail::fixed(last->loss, 6) : "non-finite"});
    double sum = 0, tsum = 0;
    int64_t n = 0, tn = 0;
    for (auto it = std::next(d.steps.begin(), d.steps.size() > 1 ? 1 : 0); it != d.steps.end(); ++it) {
      if (std::isfinite(it->second.samples_per_s)) sum += it->second.samples_per_s, ++n;
      if (std::isfinite(it->second.tokens_per_s)) tsum += it->second.tokens_per_s, ++tn;
    }
    if (n > 0)
      rows.push_back({"mean samples/s", detail::sig(sum / n, 5) + (d.steps.size() > 1 ? " (without the first step)" : "")});
    if (tn > 0) rows.push_back({"mean tokens/s", detail::sig(tsum / tn, 5)});
    const StepRow* top = nullptr;
    int64_t top_step = 0;
    for (const auto& [s, r] : d.steps)
      if (std::isfinite(r.peak) && (!top || r.peak > top->peak)) top = &r, top_step = s;
    if (top) {
      std::string parts = "parameters " + detail::bytes(top->params) + ", gradients " + detail::bytes(top->grads) +
                          ", optimizer " + detail::bytes(top->optimizer) + ", activations " +
                          detail::bytes(top->activations);
      if (top->comm_buffers > 0) parts += ", gradient buckets " + detail::bytes(top->comm_buffers);
      if (top->other > 0) parts += ", other " + detail::bytes(top->other);
      rows.push_back({"peak memory", detail::bytes(top->peak) + " at step " + std::to_string(top_step) + " (" +
                                         escape(parts) + ")"});
    }
  }
  rows.push_back({"checkpoints written",
                  d.checkpoints == 0 ? "0"
                                     : std::to_string(d.checkpoints) + ", mean " +
                                           detail::sig(d.checkpoint_seconds / d.checkpoints, 3) + " s to write, mean " +
                                           detail::sig(d.checkpoint_stall_s / d.checkpoints, 3) +
                                           " s stall; last " + detail::bytes(d.checkpoint_bytes)});
  auto list = [](const std::vector<Marker>& m) {
    std::string out = std::to_string(m.size());
    for (size_t i = 0; i < m.size() && i < 20; ++i)
      out += (i == 0 ? ": " : "; ") + std::string("step ") + std::to_string(m[i].step) + " " + escape(m[i].what);
    if (m.size() > 20) out += "; …";
    return out;
  };
  rows.push_back({"skipped steps", list(d.skipped)});
  rows.push_back({"out-of-memory back-offs", list(d.backoffs)});
  if (!d.resumes.empty()) rows.push_back({"resumed", list(d.resumes)});
  if (d.plan) {
    const auto& p = *d.plan;
    auto g = [&](const char* k) { return p.contains(k) ? (p[k].is_string() ? p[k].get<std::string>() : p[k].dump()) : ""; };
    auto b = [&](const char* k) { return p.contains(k) && p[k].is_number() ? detail::bytes(p[k].get<double>()) : "—"; };
    auto n = [&](const char* k) { return p.contains(k) && p[k].is_number() ? detail::sig(p[k].get<double>(), 4) : "—"; };
    rows.push_back({"plan", escape(g("precision") + ", activation recompute " + g("recompute") +
                                   ", micro-batch " + g("micro_batch") + " × " + g("accumulation") + " (budget " +
                                   b("budget_bytes") + "; peak predicted " + b("predicted_peak_bytes") +
                                   ", measured " + b("measured_peak_bytes") + "; samples/s predicted " +
                                   n("predicted_samples_per_s") + ", measured " + n("measured_samples_per_s") + ")")});
  }
  std::string out = "<h2>Summary</h2>\n" + detail::key_value_table(rows);
  if (!d.epochs.empty()) {
    // Columns a run has (accuracy for classifiers, perplexity for language models).
    bool acc = false, ppl = false;
    for (const auto& [e, r] : d.epochs) acc = acc || std::isfinite(r.eval_accuracy), ppl = ppl || std::isfinite(r.eval_perplexity);
    std::vector<std::string> head = {"epoch", "after step", "eval loss"};
    if (acc) head.push_back("eval accuracy");
    if (ppl) head.push_back("eval perplexity");
    for (const char* h : {"time (s)", "samples/s", "peak memory"}) head.push_back(h);
    std::vector<std::vector<std::string>> t;
    for (const auto& [e, r] : d.epochs) {
      std::vector<std::string> row = {std::to_string(e + 1), detail::sig(r.step, 12), detail::sig(r.eval_loss, 5)};
      if (acc) row.push_back(std::isfinite(r.eval_accuracy) ? detail::fixed(100 * r.eval_accuracy, 2) + "%" : "—");
      if (ppl) row.push_back(detail::sig(r.eval_perplexity, 5));
      for (const auto& c : {detail::sig(r.epoch_time_s, 3), detail::sig(r.samples_per_s, 5), detail::bytes(r.peak)})
        row.push_back(c);
      t.push_back(row);
    }
    out += "<h2>Epochs</h2>\n" + detail::table(head, t);
  }
  return out;
}

}  // namespace

Result render_run(const std::string& run_dir, const std::string& out_dir, const Options& options) {
  if (!files::exists(run_dir)) throw ReportError(run_dir + ": no such run folder");
  if (!files::is_directory(run_dir)) throw ReportError(run_dir + ": not a folder (give the run's --out folder)");
  const std::string metrics = files::join(run_dir, "metrics.jsonl");
  if (!files::exists(metrics))
    throw ReportError(metrics + ": no such file (is " + run_dir + " the --out folder of a training run?)");
  Result res;
  const RunData d = read_metrics(metrics, res.warnings);
  const auto cfg = read_config(files::join(run_dir, "config.json"));
  res.out_dir = out_dir.empty() ? files::join(run_dir, "report") : out_dir;

  detail::Staging stage(res.out_dir);
  RunReport r(d, stage);
  r.draw_all();
  if (!r.plots().empty()) {
    stage.write("gnuplot/plots.gp", "# Drawn by `leantrain report`; rerun from this folder: gnuplot gnuplot/plots.gp\n" +
                                        r.script());
    detail::run_gnuplot(detail::gnuplot_program(options.gnuplot), stage.dir(), "gnuplot/plots.gp", "gnuplot/log.txt");
  }
  std::string body;
  for (const auto& w : res.warnings) body += "<p class=\"warn\">" + detail::escape(w) + "</p>\n";
  body += summary_html(d, cfg, run_dir);
  body += "<h2>Plots</h2>\n";
  for (const auto& [png, caption] : r.sections())
    body += png.empty() ? "<p class=\"omitted\">" + detail::escape(caption) + "</p>\n" : detail::figure(png, caption);
  std::string title = "leantrain run " + run_dir;
  if (cfg) title += " (" + config_text(cfg, "model", "kind") + ", " + config_text(cfg, "precision", "mode") + ")";
  stage.write("index.html", detail::page(title, body));
  stage.commit();
  for (const auto& p : r.plots()) res.plots.push_back(p.png);
  res.omitted = r.omitted();
  return res;
}

}  // namespace lt::report
