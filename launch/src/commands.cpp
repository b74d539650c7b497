#include "commands.h"

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/checkpoint_io/hdf5_info.h"
#include "leantrain/cli/cli.h"
#include "leantrain/comm/communicator.h"
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

namespace lt::cli {
namespace {

std::string default_out_dir(const std::string& config_path) {
  return files::join("runs", files::stem(config_path));
}

// The config with its [model] and [data] kinds resolved: unknown keys and bad values of a
// kind's options fail here, before any device or thread is set up. Its warnings (a deprecated
// key) are printed once, by rank 0.
// With --init-from a Hugging Face directory, the model options config.json determines are
// filled in first (trainers::model_section_for_init): `--init-from DIR` alone is a model config.
Config load_resolved(const std::string& path, const std::vector<std::string>& sets, const std::string& init_from = "") {
  Config raw = load_config(path, sets);
  std::vector<std::string> notes;
  raw.model = trainers::model_section_for_init(raw.model, init_from, &notes);
  Config cfg = trainers::resolve_components(raw);
  for (const auto& w : cfg.warnings) log::warn(w);
  for (const auto& n : notes) log::info(n);
  cfg.warnings.clear();  // printed; a second load (--auto) must not print them again
  return cfg;
}

// The planner chooses train.micro_batch: the config's own need not divide the global batch.
void validate_for_planning(Config cfg, int world_size) {
  cfg.train.micro_batch = 1;
  validate(cfg, world_size);
}

/// Probes (rank 0 for every rank when `comm` is given), prints the table, writes
/// <out>/plan.json and the `plan` event (rank 0).
trainers::Plan plan_and_report(const Config& cfg, const RuntimeContext& ctx, const std::string& out, double margin,
                               bool write_metrics, comm::Communicator* comm = nullptr) {
  trainers::PlanOptions opt;
  opt.budget = parse_bytes(cfg.memory.budget);
  opt.margin = margin;
  auto plan = comm ? trainers::agree_on_plan(cfg, ctx, *comm, opt) : trainers::make_plan(cfg, ctx, ctx.world.size, opt);
  if (ctx.world.rank == 0) {
    std::cout << trainers::plan_table(plan) << std::flush;
    files::make_dirs(out);
    files::write_atomic(files::join(out, "plan.json"), trainers::plan_to_json(plan) + "\n");
    if (write_metrics) {
      trainers::MetricsWriter metrics(files::join(out, "metrics.jsonl"), true);
      metrics.event("plan", trainers::plan_event(plan));
    }
  }
  return plan;
}

// Under mpirun, an error only this rank raised ends the job here, where the communicator is
// known (Note [Errors on one rank]); an error every rank reached goes on to lt::cli::main.
template <class F>
int on_every_rank(const std::string& program, comm::Communicator& comm, F&& body) {
  try {
    return body();
  } catch (...) {
    if (comm.size() == 1 || classify_error(std::current_exception()).every_rank) throw;
    return handle_current_exception(program, &comm);
  }
}

void log_done(const trainers::TrainSummary& s, const std::string& out) {
  const std::string eval =
      !s.evaluated ? ", no eval set"
                   : ", eval loss " + std::to_string(s.eval_loss) +
                         (s.eval_accuracy >= 0 ? ", eval accuracy " + std::to_string(100.0 * s.eval_accuracy) + "%"
                                               : std::string());
  log::info("done: " + std::to_string(s.steps) + " steps in " + std::to_string(s.seconds) + " s, final loss " +
            std::to_string(s.final_loss) + eval + "; metrics in " + out + "/metrics.jsonl");
}

}  // namespace

std::string version_text() {
  return std::string("leantrain ") + LEANTRAIN_VERSION + "\n  LibTorch " + torch_version() + "\n  HDF5 " +
         checkpoint_io::hdf5_version() + "\n  MPI " + comm::mpi_library_version() + "\n  NCCL " +
         comm::nccl_version() + "\n  CUDA devices visible: " + std::to_string(cuda_device_count());
}

int run_plan(const std::string& program, PlanArgs a) {
  const World world = detect_world();
  log::init(world.rank, world.size, false);
  if (!a.memory_budget.empty()) a.sets.push_back("memory.budget=\"" + a.memory_budget + "\"");
  if (a.global_batch != 0) a.sets.push_back("train.global_batch=" + std::to_string(a.global_batch));
  const Config cfg = load_resolved(a.config, a.sets);
  validate_for_planning(cfg, world.size);
  const RuntimeContext ctx = make_runtime_context(cfg, world);
  const std::string out = a.out.empty() ? default_out_dir(a.config) : a.out;
  if (world.size == 1) {
    plan_and_report(cfg, ctx, out, a.margin, true);
    return kExitOk;
  }
  // Under mpirun: rank 0 plans for all ranks (Note [--auto across ranks]).
  auto comm = comm::make_communicator(cfg.comm, ctx);
  return on_every_rank(program, *comm, [&] {
    plan_and_report(cfg, ctx, out, a.margin, true, comm.get());
    return kExitOk;
  });
}

int run_train(const std::string& program, TrainArgs a) {
  if (!a.start.resume.empty() && !a.start.init_from.empty())
    throw ConfigError("--resume and --init-from exclude each other: resume continues a run, --init-from starts a "
                      "new one from its weights");
  if (a.start.init_skip_mismatched && a.start.init_from.empty())
    throw ConfigError("--init-skip-mismatched needs --init-from");
  if (!a.memory_budget.empty()) a.sets.push_back("memory.budget=\"" + a.memory_budget + "\"");
  const World world = detect_world();
  log::init(world.rank, world.size, false);
  Config cfg = load_resolved(a.config, a.sets, a.start.init_from);
  log::init(world.rank, world.size, cfg.log.all_ranks);
  const std::string out = a.out.empty() ? default_out_dir(a.config) : a.out;
  if (a.auto_plan) {
    if (parse_bytes(cfg.memory.budget) <= 0)
      throw ConfigError("--auto needs a memory budget: --memory-budget SIZE (or memory.budget)");
    validate_for_planning(cfg, world.size);
  } else {
    validate(cfg, world.size);
  }
  // The plan changes neither the device, the threads nor the communicator.
  const RuntimeContext ctx = make_runtime_context(cfg, world);
  auto comm = comm::make_communicator(cfg.comm, ctx);
  return on_every_rank(program, *comm, [&] {
    if (a.auto_plan) {
      // Note [--auto across ranks] (trainers/src/planner_agree.cpp): rank 0 plans for every rank.
      const auto plan = plan_and_report(cfg, ctx, out, 0.10, false, comm.get());
      for (const auto& o : trainers::plan_overrides(plan)) a.sets.push_back(o);
      cfg = load_resolved(a.config, a.sets, a.start.init_from);
      validate(cfg, world.size);
      a.start.plan_event = trainers::plan_event(plan);
    }
    const auto s = trainers::run_training(cfg, ctx, *comm, out, a.start);
    if (s.preempted) return kExitPreempted;
    log_done(s, out);
    return kExitOk;
  });
}

// `export`: a checkpoint's weights as safetensors (leantrain's names) or in the model kind's
// other library's names (Hugging Face directory, torchvision state dict).
int run_export(const ExportArgs& a) {
  log::init(0, 1, false);
  trainers::ExportOptions opt;
  opt.dtype = a.dtype;
  opt.source = a.source;
  try {
    opt.max_shard_bytes = parse_bytes(a.max_shard_size);
  } catch (const std::invalid_argument& e) {
    throw ConfigError("--max-shard-size " + a.max_shard_size + ": " + e.what());
  }
  std::vector<std::string> notes;
  const auto written = trainers::export_weights(a.checkpoint, a.format, a.out, &notes, opt);
  for (const auto& n : notes) log::warn(n);
  std::string list;
  for (const auto& w : written) list += (list.empty() ? "" : ", ") + w;
  log::info("exported " + a.checkpoint + " (--format " + a.format + ", " + a.dtype + "): " + list);
  return kExitOk;
}

int run_inspect(const std::string& path, bool json) {
  log::init(0, 1, false);
  const auto c = checkpoint_io::read_checkpoint(path);
  std::cout << checkpoint_io::describe(c, path, json) << std::endl;
  return kExitOk;
}

// `report`: bad input and a missing gnuplot are report errors (exit 2); a failing gnuplot or
// an unwritable output folder are failures (exit 1).
int run_report(const ReportArgs& a) {
  log::init(0, 1, false);
  if (a.run_dir.empty() == a.bench.empty())
    throw ConfigError("report takes a run folder (report RUN_DIR [--out DIR]) or a benchmark file (report --bench "
                      "BENCH.jsonl --out DIR), not " +
                      std::string(a.bench.empty() ? "neither" : "both"));
  if (!a.bench.empty() && a.out.empty()) throw ConfigError("report --bench needs --out DIR");
  const report::Result r = a.bench.empty() ? report::render_run(a.run_dir, a.out) : report::render_bench(a.bench, a.out);
  for (const auto& w : r.warnings) log::warn(w);
  for (const auto& o : r.omitted) log::info("not drawn: " + o);
  std::string drawn;
  for (const auto& p : r.plots) drawn += (drawn.empty() ? "" : ", ") + p;
  log::info("report in " + files::join(r.out_dir, "index.html") + " (" +
            (drawn.empty() ? std::string("no plots") : drawn) + ")");
  return kExitOk;
}

int run_options() {
  std::cout << trainers::registered_options_markdown();
  return kExitOk;
}

}  // namespace lt::cli
