#pragma once
// The subcommands of lt::cli::main, each a function of its parsed arguments returning the exit
// code. Errors are thrown, and reported by lt::cli::main through the table of
// runtime/src/errors.cpp; only errors of one rank among several are reported here, where the
// communicator that must end the job is known (Note [Errors on one rank]).
#include <cstdint>
#include <string>
#include <vector>

#include "leantrain/trainers/checkpointing.h"

namespace lt::cli {

struct TrainArgs {
  std::string config, out, memory_budget;
  std::vector<std::string> sets;
  trainers::StartOptions start;
  bool auto_plan = false;
};

struct PlanArgs {
  std::string config, out, memory_budget;
  std::vector<std::string> sets;
  int64_t global_batch = 0;
  double margin = 0.10;
};

struct ExportArgs {
  std::string checkpoint, format, out;
  std::string dtype = "fp32";
  std::string max_shard_size = "5GB";  // --format hf: shards above it (trainers::ExportOptions)
  std::string source;                  // --format hf: the Hugging Face directory the model came from
};

struct ReportArgs {
  std::string run_dir, bench, out;
};

int run_train(const std::string& program, TrainArgs a);
int run_plan(const std::string& program, PlanArgs a);
int run_inspect(const std::string& checkpoint, bool json);
int run_export(const ExportArgs& a);
int run_report(const ReportArgs& a);
int run_options();
std::string version_text();

}  // namespace lt::cli
