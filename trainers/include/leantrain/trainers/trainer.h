#pragma once
// The Trainer: one path from data to update (llm.c's shape). Setup once; then for each
// optimizer step every rank runs its micro-batches of global batch k, accumulating gradients
// locally; gradients are reduced once, clipped and applied (train_step). Evaluation runs at
// the end of every epoch, sharded over the ranks (evaluate); checkpoints are written on sync
// steps (maybe_checkpoint); run() is the loop that calls them. The planner's probes and the
// benchmarks call the same train_step, so what they measure is what trains.
//
//   auto parts = lt::trainers::make_components(cfg);      // or your own model and datasets
//   lt::trainers::TrainerOptions opt;
//   opt.out_dir = "runs/x";
//   lt::trainers::Trainer trainer(cfg, parts, ctx, comm, opt);
//   auto summary = trainer.run();
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "leantrain/comm/communicator.h"
#include "leantrain/comm/grad_sync.h"
#include "leantrain/data/dataset.h"
#include "leantrain/data/prefetch.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/precision.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/components.h"
#include "leantrain/trainers/hooks.h"
#include "leantrain/trainers/metrics.h"
#include "leantrain/trainers/phase_clock.h"
#include "leantrain/trainers/precision.h"
#include "leantrain/trainers/progress.h"
#include "leantrain/trainers/step_policies.h"

namespace lt::trainers {

/// How a Trainer runs besides its config.
struct TrainerOptions {
  std::string out_dir;  // metrics.jsonl, config.json, checkpoints/ (rank 0); empty: no files
  StartOptions start;   // resume / init-from / the planner's choice
  std::shared_ptr<TrainerHooks> hooks;  // faults, turns; null: none
  bool oom_backoff = true;  // false: an out-of-memory error in a step is rethrown (the planner's probes)
  /// Keep gradients allocated across steps (zeroed in place) even on one rank, as the
  /// gradient buckets do under mpirun; the planner probes a multi-rank candidate with it.
  /// Unset: world size > 1.
  std::optional<bool> hold_gradients;
};

struct TrainSummary {
  int64_t steps = 0;
  int64_t epochs = 0;
  double final_loss = 0;       // training loss of the last step
  bool evaluated = false;      // an evaluation ran (there is an eval set and an epoch ended)
  double eval_loss = 0;        // of the last evaluation
  double eval_accuracy = -1;   // classifiers and masked LMs; -1 when not applicable
  double seconds = 0;
  int64_t peak_mem_bytes = 0;  // largest per-step peak
  bool preempted = false;      // stopped by SIGTERM/SIGUSR1 after writing a checkpoint
};

/// One optimizer step as it ran (Note [Memory breakdown] for the byte fields).
struct StepResult {
  int64_t step = 0;  // 1-based
  int64_t epoch = 0;
  double loss = 0;   // mean over the global batch, every rank's
  double lr = 0;
  double loss_scale = 1;  // the scale the step ran with
  bool applied = false;   // the update was applied (not skipped)
  bool nonfinite_loss = false;
  bool stop = false;      // some rank was asked to stop (preemption)
  int64_t micro_batch = 0, accumulation = 0;  // as run, after any back-off
  int64_t tokens = 0;                         // this rank's input tokens (language models)
  double step_time_s = 0, data_time_s = 0;
  double compute_s = 0;   // forward + backward of all micro-batches
  double update_s = 0;    // gradient sync wait, unscale, clip and the optimizer step
  double comm_time_s = 0, comm_exposed_s = 0;
  /// What timed data_time_s, compute_s, update_s and the comm times: "host" clocks, or
  /// "cuda_events" on a GPU (PhaseClock; Note [Step timings on a GPU]).
  std::string timing = "host";
  int64_t calls_in_microbatches = 0, grad_allreduce_calls = 0;
  int64_t buckets_in_backward = 0;  // gradient buckets whose all-reduce started inside the last backward
  int64_t grad_reduce_scatter_calls = 0, param_allgather_calls = 0;  // memory.shard's collectives
  /// Bytes this rank sent in the step's collectives, counted as ring algorithms send them: an
  /// all-reduce of B bytes 2 (N-1)/N B, a reduce-scatter or an all-gather (N-1)/N B each.
  int64_t comm_bytes = 0;
  int64_t peak_bytes = 0, base_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, other_bytes = 0;
  int64_t activation_bytes() const { return std::max<int64_t>(0, peak_bytes - base_bytes - grad_bytes); }
};

struct EvalResult {
  double loss = 0;
  double accuracy = -1;  // -1 for causal language models
  int64_t shard_samples = 0;  // the samples this rank evaluated (its share)
  double seconds = 0;         // this rank's evaluation, the reduction included
};

class Trainer {
 public:
  /// Validates its input (ConfigError naming what is wrong: a null model or training set, a
  /// global batch larger than the training set or not a multiple of world x micro-batch), places
  /// the model, broadcasts rank 0's weights, builds the optimizer and the loss scaler, checks
  /// the memory budget, and resumes or initialises per `opt.start`. `ctx` and `comm` are
  /// borrowed: they must outlive the Trainer.
  Trainer(const Config& cfg, Components components, const RuntimeContext& ctx, comm::Communicator& comm,
          TrainerOptions opt = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  /// Runs optimizer step `step` (0-based: global batch step % steps_per_epoch() of epoch
  /// step / steps_per_epoch()) on every rank: micro-batches, one gradient reduction, the
  /// update. Backs off on out-of-memory (opt.oom_backoff); applies the non-finite policy.
  StepResult train_step(int64_t step);
  /// The eval set, sharded over the ranks and reduced: the same result on any world size.
  /// Nothing when there is no eval set.
  std::optional<EvalResult> evaluate(int64_t epoch);
  /// Writes a checkpoint after `r` when the schedule says so (rank 0).
  void maybe_checkpoint(const StepResult& r);
  /// The loop: steps from the start step to the end, metrics, evaluations, checkpoints.
  TrainSummary run();

  models::Model& model() { return *parts_.model; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  MemoryMeter& meter() { return meter_; }
  int64_t micro_batch() const { return micro_; }
  int64_t accumulation() const { return accum_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  int64_t total_steps() const { return total_steps_; }

 private:
  struct MicroBatches;
  class StepTelemetry;
  void check_budget();
  void start_from(const StartOptions& start);
  void open_outputs();
  void log_start() const;
  void set_step_deadline();
  double set_learning_rate(int64_t step);
  void zero_gradients();
  MicroBatches run_micro_batches(int64_t step, const std::vector<int64_t>& perm, int attempt);
  void reduce_gradients(const MicroBatches& mb);
  int64_t agree_on_step(const MicroBatches& mb, StepResult& r);
  void want_next_micro_batch(int64_t step, const std::vector<int64_t>& perm, int64_t j);
  void back_off(int64_t step, bool oom_here, const std::string& what, int64_t ranks_oom);
  void record_step(const StepResult& r);
  void end_epoch(int64_t epoch, int64_t step);
  const std::vector<int64_t>& permutation(int64_t epoch);

  Config cfg_;  // as running: an out-of-memory back-off changes train.micro_batch
  Components parts_;
  const RuntimeContext& ctx_;
  comm::Communicator& comm_;
  TrainerOptions opt_;
  std::shared_ptr<TrainerHooks> hooks_;
  torch::Device device_;
  Precision precision_;  // precision.mode
  MemoryMeter meter_;
  std::unique_ptr<data::Prefetcher> prefetch_;  // the training set's next micro-batch (Note [Prefetch])
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<LossScaler> scaler_;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<comm::GradientSync> grad_sync_;
  std::unique_ptr<PhaseClock> clock_;  // the steps' phase times (Note [Step telemetry])
  std::optional<PhaseClock::Mark> first_bucket_mark_;  // on a device: where the try's first gradient bucket started
  NonfinitePolicy nonfinite_;
  CheckpointSchedule schedule_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<CheckpointWriter> writer_;
  std::unique_ptr<Progress> progress_;
  std::string ckpt_dir_, resumed_from_;
  int world_ = 1, rank_ = 0;
  bool hold_grads_ = false;
  comm::ShardStage shard_ = comm::ShardStage::kNone;  // memory.shard as run (a world of one: none)
  int64_t micro_ = 0, accum_ = 0, steps_per_epoch_ = 0, total_steps_ = 0, start_step_ = 0;
  int64_t param_bytes_ = 0, budget_ = 0, budget_minimum_ = 0, eval_batch_ = 0;
  bool generous_step_ = true;  // Note [Deadlines]
  std::vector<int64_t> perm_;
  int64_t perm_epoch_ = -1;
  // The epoch being run, for its epoch event.
  int64_t epoch_peak_ = 0, epoch_act_peak_ = 0, epoch_samples_ = 0;
  std::chrono::steady_clock::time_point epoch_start_;
  TrainSummary summary_;
};

/// The command line's entry: the registered components of `cfg`, built on every rank and agreed
/// on (comm::agreed_setup: an error on one rank stops them all with its code), the hooks of the
/// environment (LEANTRAIN_FAULT, LEANTRAIN_BENCH_TURNS), a Trainer writing to `out_dir`, run().
TrainSummary run_training(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm,
                          const std::string& out_dir, const StartOptions& start = {});

}  // namespace lt::trainers
