#pragma once
// The single path from data to update (llm.c's shape): for each optimizer step, every
// rank runs its micro-batches of global batch k, accumulating gradients locally; gradients
// are reduced once, clipped, and applied. Evaluation runs at the end of every epoch.
#include <cstdint>
#include <string>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/checkpointing.h"

namespace lt::trainers {

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs = 0;
  double final_loss = 0;       // training loss of the last step
  double eval_loss = 0;        // of the last evaluation
  double eval_accuracy = -1;   // classifiers and masked LMs; -1 when not applicable
  double seconds = 0;
  int64_t peak_mem_bytes = 0;  // largest per-step peak
  bool preempted = false;      // stopped by SIGTERM/SIGUSR1 after writing a checkpoint
};

/// Trains per `cfg` and writes <out_dir>/metrics.jsonl and <out_dir>/config.json (rank 0).
/// Throws ConfigError for configurations that cannot run (named key), DataError for bad data.
TrainSummary run_training(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm,
                          const std::string& out_dir, const StartOptions& start = {});

}  // namespace lt::trainers
