#pragma once
// The training state <-> checkpoint files: what is saved on sync steps, how a run resumes
// (auto / path, on any world size), fine-tuning from weights only, and the background
// writer that keeps the training stall to a copy of the state.
#include <chrono>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/config.h"
#include "leantrain/trainers/metrics.h"
#include "leantrain/trainers/precision.h"

namespace lt::trainers {

/// Where a run starts: from scratch, a full resume, or weights only (fine-tuning).
struct StartOptions {
  std::string resume;            // "" | "auto" (newest valid in the checkpoint dir) | PATH
  std::string init_from;         // PATH: FP32 model weights only; fresh optimizer, step 0
  bool init_skip_mismatched = false;  // with init_from: skip tensors whose shapes differ
  MetricFields plan_event;       // train --auto: the planner's choice, written first to metrics.jsonl
};

/// The checkpoint directory of a run: checkpoint.dir, or <out>/checkpoints.
std::string checkpoint_dir(const Config& cfg, const std::string& out_dir);

/// Parameters then buffers, under their named_parameters()/named_buffers() names.
std::vector<checkpoint_io::NamedTensor> model_tensors(torch::nn::Module& model);

/// Everything exact resume needs after `step` optimizer steps. `copy` clones every tensor
/// (for the background writer); otherwise the checkpoint aliases the live tensors.
/// `gathered`: the optimizer state already gathered from the ranks (a sharded
/// optim::ShardedOptimizer's full_state(), a collective the caller ran on every rank).
checkpoint_io::Checkpoint capture_state(const Config& cfg, int world, torch::nn::Module& model,
                                        torch::optim::Optimizer& optimizer, const LossScaler& scaler,
                                        int64_t step, int64_t steps_per_epoch, bool copy,
                                        std::vector<checkpoint_io::NamedTensor>* gathered = nullptr);

/// Parameters under their named_parameters() names.
std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(torch::nn::Module& model);

/// Loads a checked checkpoint into the model, the optimizer and the scaler.
void restore_state(const checkpoint_io::Checkpoint& c, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, LossScaler& scaler);

/// Resolves `resume` (auto or a path) collectively: rank 0 picks the file (auto falls back
/// to an older checkpoint, with a warning, when the newest is damaged), every rank reads and
/// verifies it, and all ranks fail together if any cannot. Returns nothing when `auto`
/// finds no checkpoint (a fresh start). Throws CheckpointError / ConfigError.
std::optional<checkpoint_io::Checkpoint> load_for_resume(const std::string& resume, const std::string& dir,
                                                         torch::nn::Module& model, comm::Communicator& comm,
                                                         std::string* chosen_path);

/// Writes checkpoints one at a time on a background thread (or inline when not async).
/// A failed write surfaces as lt::StorageError (naming the file and the directory) from the
/// next submit(), write_now() or wait(); the checkpoints committed before it stay intact.
class CheckpointWriter {
 public:
  using Clock = std::chrono::steady_clock;
  /// Called once a checkpoint is committed, on the thread that wrote it. `stall_s` is the time
  /// training waited for it: from `since` (given to submit/write_now: when the state capture
  /// began) to the start of a background write, or to the end of a write on the caller's thread.
  using Done = std::function<void(const std::string& path, const checkpoint_io::WriteStats&, double stall_s)>;
  CheckpointWriter(std::string dir, int64_t keep_last, bool async, Done done);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  /// Waits for the previous write, then writes `c` (in the background when async).
  void submit(checkpoint_io::Checkpoint c, Clock::time_point since = Clock::now());
  /// Waits for the previous write, then writes `c` on this thread.
  void write_now(const checkpoint_io::Checkpoint& c, Clock::time_point since = Clock::now());
  /// Waits for the write in flight; rethrows its error.
  void wait();
  bool async() const { return async_; }

 private:
  void write(const checkpoint_io::Checkpoint& c, double stall_s, Clock::time_point since);
  std::string dir_;
  int64_t keep_last_;
  bool async_;
  Done done_;
  std::thread thread_;
  std::exception_ptr error_;
};

}  // namespace lt::trainers
