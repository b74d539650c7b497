// leantrain's command line. The only place that exits: library code throws, and this maps
// errors to exit codes (docs/ERRORS.md): 0 success, 1 runtime failure, 2 usage/config error,
// 4 a failed checkpoint write, 75 preempted (3, a missed deadline, comes from comm/).
#include <CLI/CLI.hpp>
#include <c10/util/Exception.h>

#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/checkpoint_io/hdf5_info.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/data/dataset.h"
#include "leantrain/report/report.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"
#include "leantrain/trainers/metrics.h"
#include "leantrain/trainers/planner.h"
#include "leantrain/trainers/pretrained.h"
#include "leantrain/trainers/trainer.h"

#ifndef LEANTRAIN_VERSION
#define LEANTRAIN_VERSION "unknown"
#endif

namespace {

std::string version_text() {
  return std::string("leantrain ") + LEANTRAIN_VERSION + "\n  LibTorch " + lt::torch_version() +
         "\n  HDF5 " + lt::checkpoint_io::hdf5_version() + "\n  MPI " + lt::comm::mpi_library_version() +
         "\n  NCCL " + lt::comm::nccl_version() + "\n  CUDA devices visible: " +
         std::to_string(lt::cuda_device_count());
}

std::string default_out_dir(const std::string& config_path) {
  return lt::files::join("runs", lt::files::stem(config_path));
}

/// Prints the one-line message of the exception in flight ("leantrain: <who>config error:
/// ...") and returns its exit code (docs/ERRORS.md). Call only inside a catch block.
int report_current_exception(const std::string& who = "") {
  const std::string lead = "leantrain: " + who;
  try {
    throw;
  } catch (const lt::ConfigError& e) {
    std::cerr << lead << "config error: " << e.what() << std::endl;
    return lt::kExitUsage;
  } catch (const lt::checkpoint_io::CheckpointError& e) {
    std::cerr << lead << "checkpoint error: " << e.what() << std::endl;
    return lt::kExitUsage;
  } catch (const lt::DataError& e) {
    std::cerr << lead << "data error: " << e.what() << std::endl;
    return lt::kExitUsage;
  } catch (const lt::StorageError& e) {
    std::cerr << lead << "storage error: " << e.what() << std::endl;
    return lt::kExitStorage;
  } catch (const lt::TrainingStopped& e) {
    std::cerr << lead << "training stopped: " << e.what() << std::endl;
    return lt::kExitFailure;
  } catch (const c10::Error& e) {
    // LibTorch errors carry a C++ backtrace; users need the message.
    std::cerr << lead << "error: " << e.what_without_backtrace() << std::endl;
    return lt::kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << lead << "error: " << e.what() << std::endl;
    return lt::kExitFailure;
  }
}

// Note [Errors on one rank]: config, data and checkpoint-read errors and a stop on a
// non-finite loss are reached by every rank together (the inputs are the same, or the ranks
// agree through a collective), so each rank reports and exits. Any other failure (a LibTorch
// error, a failed checkpoint write on rank 0) happens on one rank only, and the others would
// wait for it in their next collective until the deadline: that rank reports, then ends the
// whole job at once (comm abort) with its exit code.
bool reached_by_every_rank(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const lt::ConfigError&) {
    return true;
  } catch (const lt::checkpoint_io::CheckpointError&) {
    return true;
  } catch (const lt::DataError&) {
    return true;
  } catch (const lt::TrainingStopped&) {
    return true;
  } catch (...) {
    return false;
  }
}

/// Probes (rank 0 for every rank when `comm` is given), prints the table, writes
/// <out>/plan.json and the `plan` event (rank 0).
lt::trainers::Plan plan_and_report(const lt::Config& cfg, const lt::RuntimeContext& ctx, const std::string& out,
                                   double margin, bool write_metrics, lt::comm::Communicator* comm = nullptr) {
  lt::trainers::PlanOptions opt;
  opt.budget = lt::parse_bytes(cfg.memory.budget);
  opt.margin = margin;
  auto plan = comm ? lt::trainers::agree_on_plan(cfg, ctx, *comm, opt)
                   : lt::trainers::make_plan(cfg, ctx, ctx.world.size, opt);
  if (ctx.world.rank == 0) {
    std::cout << lt::trainers::plan_table(plan) << std::flush;
    lt::files::make_dirs(out);
    lt::files::write_atomic(lt::files::join(out, "plan.json"), lt::trainers::plan_to_json(plan) + "\n");
    if (write_metrics) {
      lt::trainers::MetricsWriter metrics(lt::files::join(out, "metrics.jsonl"), true);
      metrics.event("plan", lt::trainers::plan_event(plan));
    }
  }
  return plan;
}

// The config with its [model] and [data] kinds resolved: unknown keys and bad values of a
// kind's options fail here, before any device or thread is set up.
lt::Config load_resolved(const std::string& path, const std::vector<std::string>& sets) {
  return lt::trainers::resolve_components(lt::load_config(path, sets));
}

// The planner chooses train.micro_batch: the config's own need not divide the global batch.
void validate_for_planning(lt::Config cfg, int world_size) {
  cfg.train.micro_batch = 1;
  lt::validate(cfg, world_size);
}

int run_plan(const std::string& config_path, std::vector<std::string> sets, std::string out, double margin) {
  const lt::World world = lt::detect_world();
  lt::log::init(world.rank, world.size, false);
  lt::Config cfg = load_resolved(config_path, sets);
  validate_for_planning(cfg, world.size);
  const lt::RuntimeContext ctx = lt::make_runtime_context(cfg, world);
  if (out.empty()) out = default_out_dir(config_path);
  if (world.size == 1) {
    plan_and_report(cfg, ctx, out, margin, true);
    return lt::kExitOk;
  }
  // Under mpirun: rank 0 plans for all ranks (Note [--auto across ranks]).
  auto comm = lt::comm::make_communicator(cfg.comm, ctx);
  try {
    plan_and_report(cfg, ctx, out, margin, true, comm.get());
  } catch (...) {
    if (reached_by_every_rank(std::current_exception())) throw;
    const int code = report_current_exception("rank " + std::to_string(comm->rank()) + " on " + world.host + ": ");
    comm->abort(code);  // Note [Errors on one rank]
    return code;
  }
  return lt::kExitOk;
}

int run_train(const std::string& config_path, std::vector<std::string> sets, std::string out,
              lt::trainers::StartOptions start, bool auto_plan) {
  const lt::World world = lt::detect_world();
  lt::log::init(world.rank, world.size, false);
  lt::Config cfg = load_resolved(config_path, sets);
  lt::log::init(world.rank, world.size, cfg.log.all_ranks);
  if (out.empty()) out = default_out_dir(config_path);
  if (auto_plan) {
    if (lt::parse_bytes(cfg.memory.budget) <= 0)
      throw lt::ConfigError("--auto needs a memory budget: --memory-budget SIZE (or memory.budget)");
    validate_for_planning(cfg, world.size);
  } else {
    lt::validate(cfg, world.size);
  }
  // The plan changes neither the device, the threads nor the communicator.
  const lt::RuntimeContext ctx = lt::make_runtime_context(cfg, world);
  auto comm = lt::comm::make_communicator(cfg.comm, ctx);
  lt::trainers::TrainSummary s;
  try {
    if (auto_plan) {
      // Note [--auto across ranks] (trainers/src/planner.cpp): rank 0 plans for every rank.
      const auto plan = plan_and_report(cfg, ctx, out, 0.10, false, comm.get());
      for (const auto& o : lt::trainers::plan_overrides(plan)) sets.push_back(o);
      cfg = load_resolved(config_path, sets);
      lt::validate(cfg, world.size);
      start.plan_event = lt::trainers::plan_event(plan);
    }
    s = lt::trainers::run_training(cfg, ctx, *comm, out, start);
  } catch (...) {
    if (comm->size() == 1 || reached_by_every_rank(std::current_exception())) throw;
    const int code =
        report_current_exception("rank " + std::to_string(comm->rank()) + " on " + world.host + ": ");
    comm->abort(code);  // Note [Errors on one rank]
    return code;
  }
  if (s.preempted) return lt::kExitPreempted;
  std::string eval = !s.evaluated ? ", no eval set"
                                  : ", eval loss " + std::to_string(s.eval_loss) +
                                        (s.eval_accuracy >= 0
                                             ? ", eval accuracy " + std::to_string(100.0 * s.eval_accuracy) + "%"
                                             : std::string());
  lt::log::info("done: " + std::to_string(s.steps) + " steps in " + std::to_string(s.seconds) +
                " s, final loss " + std::to_string(s.final_loss) + eval + "; metrics in " + out + "/metrics.jsonl");
  return lt::kExitOk;
}

// `export`: a checkpoint's weights as safetensors (leantrain's names) or in the model kind's
// other library's names (Hugging Face directory, torchvision state dict).
int run_export(const std::string& checkpoint, const std::string& format, const std::string& out) {
  lt::log::init(0, 1, false);
  std::vector<std::string> notes;
  const auto written = lt::trainers::export_weights(checkpoint, format, out, &notes);
  for (const auto& n : notes) lt::log::warn(n);
  std::string list;
  for (const auto& w : written) list += (list.empty() ? "" : ", ") + w;
  lt::log::info("exported " + checkpoint + " (--format " + format + "): " + list);
  return lt::kExitOk;
}

int run_inspect(const std::string& path, bool json) {
  lt::log::init(0, 1, false);
  const auto c = lt::checkpoint_io::read_checkpoint(path);
  std::cout << lt::checkpoint_io::describe(c, path, json) << std::endl;
  return lt::kExitOk;
}

// `report`: bad input and a missing gnuplot are usage errors (exit 2); a failing gnuplot or
// an unwritable output folder are failures (exit 1, through report_current_exception).
int run_report(const std::string& run_dir, const std::string& bench, const std::string& out) {
  lt::log::init(0, 1, false);
  if (run_dir.empty() == bench.empty())
    throw lt::ConfigError("report takes a run folder (leantrain report RUN_DIR [--out DIR]) or a benchmark file "
                          "(leantrain report --bench BENCH.jsonl --out DIR), not " +
                          std::string(bench.empty() ? "neither" : "both"));
  if (!bench.empty() && out.empty()) throw lt::ConfigError("report --bench needs --out DIR");
  lt::report::Result r;
  try {
    r = bench.empty() ? lt::report::render_run(run_dir, out) : lt::report::render_bench(bench, out);
  } catch (const lt::report::ReportError& e) {
    std::cerr << "leantrain: report: " << e.what() << std::endl;
    return lt::kExitUsage;
  }
  for (const auto& w : r.warnings) lt::log::warn(w);
  for (const auto& o : r.omitted) lt::log::info("not drawn: " + o);
  std::string drawn;
  for (const auto& p : r.plots) drawn += (drawn.empty() ? "" : ", ") + p;
  lt::log::info("report in " + lt::files::join(r.out_dir, "index.html") + " (" +
                (drawn.empty() ? std::string("no plots") : drawn) + ")");
  return lt::kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"leantrain: data-parallel training of large models on memory-limited GPUs and CPUs"};
  app.require_subcommand(0, 1);
  bool show_version = false;
  app.add_flag("--version", show_version, "Print the versions of leantrain and its libraries");

  std::string config_path, out_dir;
  std::vector<std::string> sets;
  auto* train = app.add_subcommand("train", "Train a model from a TOML config");
  train->add_option("--config", config_path, "Config file (TOML); see configs/")->required();
  train->add_option("--set", sets, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  train->add_option("--out", out_dir, "Output directory (default: runs/<config name>)");
  std::string memory_budget;
  train->add_option("--memory-budget", memory_budget,
                    "Per-rank memory limit, e.g. 8GiB (overrides memory.budget; 0: none)");
  lt::trainers::StartOptions start;
  train->add_option("--resume", start.resume,
                    "Resume from 'auto' (newest valid checkpoint of this run) or a checkpoint file");
  train->add_option("--init-from", start.init_from,
                    "Start from model weights only (fresh optimizer, step 0): a checkpoint (.h5), a .safetensors "
                    "file, or a Hugging Face model directory (config.json + model.safetensors)");
  train->add_flag("--init-skip-mismatched", start.init_skip_mismatched,
                  "With --init-from: skip (and list) tensors whose shapes differ, e.g. a new head");

  bool auto_plan = false;
  train->add_flag("--auto", auto_plan,
                  "Plan first (see `plan`) under --memory-budget, then train with the fastest configuration that fits");

  std::string plan_config, plan_out, plan_budget;
  std::vector<std::string> plan_sets;
  int64_t plan_global_batch = 0;
  double plan_margin = 0.10;
  auto* plan = app.add_subcommand(
      "plan", "Measure precision x activation checkpointing x micro-batch and pick the fastest that fits a budget");
  plan->add_option("--config", plan_config, "Config file (TOML)")->required();
  plan->add_option("--memory-budget", plan_budget, "Per-rank memory budget, e.g. 8GiB (default: memory.budget)");
  plan->add_option("--global-batch", plan_global_batch, "Global batch to keep (default: train.global_batch)");
  plan->add_option("--set", plan_sets, "Override a config key: section.key=value (repeatable)")
      ->allow_extra_args(false);
  plan->add_option("--out", plan_out, "Output directory for plan.json (default: runs/<config name>)");
  plan->add_option("--margin", plan_margin, "Safety margin below the budget (default 0.10)");

  std::string inspect_path;
  bool inspect_json = false;
  auto* inspect = app.add_subcommand("inspect", "Verify a checkpoint and print its summary");
  inspect->add_option("checkpoint", inspect_path, "Checkpoint file (.h5)")->required();
  inspect->add_flag("--json", inspect_json, "Print JSON for scripts");

  std::string export_path, export_format, export_out;
  auto* exp = app.add_subcommand("export", "Write a checkpoint's model weights as safetensors or for Hugging Face / torchvision");
  exp->add_option("checkpoint", export_path, "Checkpoint file (.h5)")->required();
  exp->add_option("--format", export_format,
                  "safetensors: leantrain's names + the model config in the metadata; hf: a Hugging Face directory "
                  "(gpt, bert) or a torchvision state dict (resnet)")
      ->required();
  exp->add_option("--out", export_out, "Output directory (gets model.safetensors, and config.json for hf)")->required();

  std::string report_run, report_bench, report_out;
  auto* report = app.add_subcommand(
      "report", "Render a run's metrics.jsonl (or a benchmark results file) into PNG plots and index.html");
  report->add_option("run_dir", report_run, "Run folder (the --out of a training run) holding metrics.jsonl");
  report->add_option("--bench", report_bench,
                     "A benchmark results file (JSON lines: bench, row, metric, value, baseline); docs/REPORT.md");
  report->add_option("--out", report_out, "Output folder (default: RUN_DIR/report; required with --bench)");

  app.add_subcommand("options",
                     "Print the options of every registered model and data kind (Markdown, as in docs/CONFIG.md)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "leantrain: " << e.what() << " (see leantrain --help)\n";
    return lt::kExitUsage;
  }
  try {
    if (show_version) {
      std::cout << version_text() << std::endl;
      return lt::kExitOk;
    }
    if (*train) {
      if (!start.resume.empty() && !start.init_from.empty())
        throw lt::ConfigError("--resume and --init-from exclude each other: resume continues a run, "
                              "--init-from starts a new one from its weights");
      if (start.init_skip_mismatched && start.init_from.empty())
        throw lt::ConfigError("--init-skip-mismatched needs --init-from");
      if (!memory_budget.empty()) sets.push_back("memory.budget=\"" + memory_budget + "\"");
      return run_train(config_path, sets, out_dir, start, auto_plan);
    }
    if (*plan) {
      if (!plan_budget.empty()) plan_sets.push_back("memory.budget=\"" + plan_budget + "\"");
      if (plan_global_batch != 0) plan_sets.push_back("train.global_batch=" + std::to_string(plan_global_batch));
      return run_plan(plan_config, plan_sets, plan_out, plan_margin);
    }
    if (*inspect) return run_inspect(inspect_path, inspect_json);
    if (*exp) return run_export(export_path, export_format, export_out);
    if (app.got_subcommand("options")) {
      std::cout << lt::trainers::registered_options_markdown();
      return lt::kExitOk;
    }
    if (*report) return run_report(report_run, report_bench, report_out);
    std::cout << app.help() << std::endl;
    return lt::kExitUsage;
  } catch (...) {
    return report_current_exception();
  }
}
