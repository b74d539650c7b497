// leantrain's command line as a library: argument parsing (CLI11) and the one place that turns
// an exception into a message and an exit code (the table of runtime/src/errors.cpp).
#include "leantrain/cli/cli.h"

#include <CLI/CLI.hpp>

#include <iostream>
#include <string>

#include "commands.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/world.h"

namespace lt::cli {
namespace {

void add_train(CLI::App& app, TrainArgs& a) {
  auto* train = app.add_subcommand("train", "Train a model from a TOML config");
  train->add_option("--config", a.config, "Config file (TOML); see configs/")->required();
  train->add_option("--set", a.sets, "Override a config key: section.key=value (repeatable)")->allow_extra_args(false);
  train->add_option("--out", a.out, "Output directory (default: runs/<config name>)");
  train->add_option("--memory-budget", a.memory_budget,
                    "Per-rank memory limit, e.g. 8GiB (overrides memory.budget; 0: none)");
  train->add_option("--resume", a.start.resume,
                    "Resume from 'auto' (newest valid checkpoint of this run) or a checkpoint file");
  train->add_option("--init-from", a.start.init_from,
                    "Start from model weights only (fresh optimizer, step 0): a checkpoint (.h5), a .safetensors "
                    "file, or a Hugging Face model directory (config.json + model.safetensors)");
  train->add_flag("--init-skip-mismatched", a.start.init_skip_mismatched,
                  "With --init-from: skip (and list) tensors whose shapes differ, e.g. a new head");
  train->add_flag("--auto", a.auto_plan,
                  "Plan first (see `plan`) under --memory-budget, then train with the fastest configuration that fits");
}

void add_plan(CLI::App& app, PlanArgs& a) {
  auto* plan = app.add_subcommand(
      "plan", "Measure precision x recompute x micro-batch and pick the fastest configuration that fits a budget");
  plan->add_option("--config", a.config, "Config file (TOML)")->required();
  plan->add_option("--memory-budget", a.memory_budget, "Per-rank memory budget, e.g. 8GiB (default: memory.budget)");
  plan->add_option("--global-batch", a.global_batch, "Global batch to keep (default: train.global_batch)");
  plan->add_option("--set", a.sets, "Override a config key: section.key=value (repeatable)")->allow_extra_args(false);
  plan->add_option("--out", a.out, "Output directory for plan.json (default: runs/<config name>)");
  plan->add_option("--margin", a.margin, "Safety margin below the budget (default 0.10)");
}

struct FileArgs {
  std::string checkpoint, format, out;
  bool json = false;
};

void add_inspect_export(CLI::App& app, FileArgs& inspect, ExportArgs& exp) {
  auto* i = app.add_subcommand("inspect", "Verify a checkpoint and print its summary");
  i->add_option("checkpoint", inspect.checkpoint, "Checkpoint file (.h5)")->required();
  i->add_flag("--json", inspect.json, "Print JSON for scripts");
  auto* e = app.add_subcommand("export",
                               "Write a checkpoint's model weights as safetensors or for Hugging Face / torchvision");
  e->add_option("checkpoint", exp.checkpoint, "Checkpoint file (.h5)")->required();
  e->add_option("--format", exp.format,
                "safetensors: leantrain's names + the model config in the metadata; hf: a Hugging Face directory "
                "(gpt, bert, llama) or a torchvision state dict (resnet)")
      ->required();
  e->add_option("--out", exp.out, "Output directory (gets model.safetensors, and config.json for hf)")->required();
  e->add_option("--dtype", exp.dtype, "fp32 (default), bf16 or fp16: the dtype of the written tensors");
  e->add_option("--max-shard-size", exp.max_shard_size,
                "--format hf: shards of at most this size with model.safetensors.index.json, e.g. 2GB (default 5GB; "
                "0: one file)");
  e->add_option("--source", exp.source,
                "--format hf: the Hugging Face directory the model was initialised from: its tokenizer files and "
                "generation_config.json are copied, its config.json's token ids kept");
}

void add_report(CLI::App& app, ReportArgs& a) {
  auto* report = app.add_subcommand(
      "report", "Render a run's metrics.jsonl (or a benchmark results file) into PNG plots and index.html");
  report->add_option("run_dir", a.run_dir, "Run folder (the --out of a training run) holding metrics.jsonl");
  report->add_option("--bench", a.bench,
                     "A benchmark results file (JSON lines: bench, row, metric, value, baseline); docs/REPORT.md");
  report->add_option("--out", a.out, "Output folder (default: RUN_DIR/report; required with --bench)");
}

// Everything the command line parses, bound to one CLI11 app.
struct Parsed {
  CLI::App app;
  bool show_version = false;
  TrainArgs train;
  PlanArgs plan;
  FileArgs inspect;
  ExportArgs exp;
  ReportArgs report;

  explicit Parsed(const std::string& program)
      : app{"leantrain: data-parallel training of large models on memory-limited GPUs and CPUs", program} {
    app.require_subcommand(0, 1);
    app.add_flag("--version", show_version, "Print the versions of leantrain and its libraries");
    add_train(app, train);
    add_plan(app, plan);
    add_inspect_export(app, inspect, exp);
    add_report(app, report);
    app.add_subcommand("options",
                       "Print the options of every registered model and data kind (Markdown, as in docs/CONFIG.md)");
  }

  bool got(const char* name) const { return app.got_subcommand(name); }
};

// argv[0]'s file name: messages start with it ("custom_model: config error: ...").
std::string program_name(int argc, char** argv) {
  if (argc < 1 || !argv[0] || !*argv[0]) return "leantrain";
  const std::string path = argv[0];
  return path.substr(path.find_last_of('/') + 1);
}

int dispatch(Parsed& p, const std::string& program) {
  if (p.show_version) {
    std::cout << version_text() << std::endl;
    return kExitOk;
  }
  if (p.got("train")) return run_train(program, p.train);
  if (p.got("plan")) return run_plan(program, p.plan);
  // The other subcommands read a file, write a folder or print: under mpirun, rank 0 alone does
  // it (two ranks exporting into one folder would race; one copy of the output is enough).
  if (detect_world().rank != 0) return kExitOk;
  if (p.got("inspect")) return run_inspect(p.inspect.checkpoint, p.inspect.json);
  if (p.got("export")) return run_export(p.exp);
  if (p.got("report")) return run_report(p.report);
  if (p.got("options")) return run_options();
  std::cout << p.app.help() << std::endl;
  return kExitUsage;
}

}  // namespace

int handle_current_exception(const std::string& program, comm::Communicator* comm) {
  const std::exception_ptr e = std::current_exception();
  if (!e) return kExitOk;
  const ErrorClass c = classify_error(e);
  // Note [Errors on one rank] (runtime/src/errors.cpp): this rank's error alone ends the job.
  const bool ends_the_job = comm && comm->size() > 1 && !c.every_rank;
  std::string who;
  if (ends_the_job) who = "rank " + std::to_string(comm->rank()) + " on " + detect_world().host + ": ";
  // One write: the ranks of a job share mpirun's stderr, and their lines must not interleave.
  const std::string line = program + ": " + who + c.label + ": " + error_message(e) + "\n";
  std::cerr << line << std::flush;
  if (ends_the_job) comm->abort(c.exit_code);
  return c.exit_code;
}

int main(int argc, char** argv) {
  const std::string program = program_name(argc, argv);
  try {
    Parsed p(program);
    try {
      p.app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
      return p.app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
      return p.app.exit(e);
    } catch (const CLI::ParseError& e) {
      std::cerr << program << ": " << e.what() << " (see " << program << " --help)\n";
      return kExitUsage;
    }
    return dispatch(p, program);
  } catch (...) {
    return handle_current_exception(program);
  }
}

}  // namespace lt::cli
