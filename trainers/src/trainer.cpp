// The Trainer: setup, the step and the loop. Evaluation and what a run writes and logs
// (metrics, checkpoints) are trainer_outputs.cpp; the registry glue components.cpp.
#include "leantrain/trainers/trainer.h"

#include <c10/util/Exception.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "leantrain/comm/agreement.h"
#include "leantrain/data/data.h"
#include "leantrain/models/registry.h"
#include "leantrain/optim/optimizer.h"
#include "leantrain/optim/sharded_optimizer.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/runtime/device.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/trainers/preemption.h"
#include "leantrain/trainers/pretrained.h"
#include "leantrain/trainers/schedule.h"
#include "step_telemetry.h"
#include "trainer_internal.h"

namespace lt::trainers {

using trainer_detail::Clock;
using trainer_detail::first_line;
using trainer_detail::seconds_since;

namespace {

// Note [Randomness per micro-batch]
// Dropout draws from the global generator, reseeded before every micro-batch from
// (seed, step, rank, micro-batch index): a resumed run repeats an uninterrupted one, and
// no rank's stream depends on how many micro-batches another rank ran.
uint64_t micro_seed(uint64_t seed, int64_t step, int rank, int64_t micro) {
  return data::mix_seed({seed, 0x5eedULL, static_cast<uint64_t>(step), static_cast<uint64_t>(rank),
                         static_cast<uint64_t>(micro)});
}

std::string bytes_text(int64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

torch::Tensor zeros_double(const torch::Device& device) {
  return torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

void check_components(const Components& c) {
  if (!c.model) throw ConfigError("Trainer: Components.model is null: give the model to train");
  if (!c.train) throw ConfigError("Trainer: Components.train is null: give a training set");
  if (c.train->size() <= 0) throw ConfigError("Trainer: the training set is empty (" + c.train->describe() + ")");
}

// Test-only faults (TrainerHooks::micro_batch_fault: LEANTRAIN_FAULT nan / oom) at their one
// point in a micro-batch: after its forward, its gradient hooks armed, before its backward.
void inject_micro_batch_fault(TrainerHooks& hooks, int64_t step, int rank, bool last, int attempt,
                              torch::Tensor& loss) {
  switch (hooks.micro_batch_fault(step + 1, rank, last, attempt)) {
    case MicroBatchFault::kNone:
      return;
    case MicroBatchFault::kNanLoss:
      loss = loss * std::numeric_limits<double>::quiet_NaN();
      return;
    case MicroBatchFault::kOutOfMemory:
      TORCH_CHECK_WITH(OutOfMemoryError, false, "injected out of memory (LEANTRAIN_FAULT oom@", step + 1, ")");
  }
}

}  // namespace

Trainer::Trainer(const Config& cfg, Components components, const RuntimeContext& ctx, comm::Communicator& comm,
                 TrainerOptions opt)
    : cfg_(cfg),
      parts_(std::move(components)),
      ctx_(ctx),
      comm_(comm),
      opt_(std::move(opt)),
      hooks_(opt_.hooks ? opt_.hooks : std::make_shared<TrainerHooks>()),
      device_(device_of(ctx)),
      precision_(parse_precision(cfg.precision.mode)),
      meter_(ctx.device_index),
      nonfinite_(cfg.train.nonfinite, cfg.train.nonfinite_max_skips, precision_ == Precision::kFp16),
      schedule_{cfg.checkpoint.every_steps, cfg.checkpoint.at_end},
      world_(comm.size()),
      rank_(comm.rank()) {
  check_components(parts_);
  const auto& t = cfg_.train;
  if (t.micro_batch <= 0 || t.global_batch % (t.micro_batch * world_) != 0)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) + " must be a multiple of " +
                      std::to_string(world_) + " ranks x train.micro_batch " + std::to_string(t.micro_batch));
  check_precision_supported(precision_, device_);
  for (const auto& [key, value] : {std::pair<std::string, std::string>{"memory.shard", cfg_.memory.shard},
                                   {"memory.optimizer_state", cfg_.memory.optimizer_state}})
    if (value == "auto")
      throw ConfigError(key + " = 'auto' is the planner's to choose: run `leantrain train --auto` (or `leantrain "
                              "plan`), or set a value");
  hold_grads_ = opt_.hold_gradients.value_or(world_ > 1);
  micro_ = t.micro_batch;
  accum_ = accumulation_steps(t, world_);
  eval_batch_ = t.eval_batch;
  const int64_t n_train = parts_.train->size();
  steps_per_epoch_ = data::global_batches_per_epoch(n_train, t.global_batch);
  if (steps_per_epoch_ == 0)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) +
                      ": larger than the training set (" + std::to_string(n_train) + " samples)");
  total_steps_ = t.steps > 0 ? t.steps : t.epochs * steps_per_epoch_;
  std::function<void(data::Batch&)> pin;  // Note [Pinned batches]: on a GPU, pinned on the prefetch thread
  if (device_.is_cuda()) pin = [index = ctx.device_index](data::Batch& b) {
    bind_device(index);  // the thread's CUDA context is its rank's GPU, not device 0
    data::pin_memory(b);
  };
  prefetch_ = std::make_unique<data::Prefetcher>(parts_.train, 2, std::move(pin));

  auto& model = *parts_.model;
  model.to(device_);
  model.train();
  model.apply_recompute(models::RecomputePolicy::parse(cfg_.memory.recompute));
  model.set_head_matmul(recompute::parse_head_matmul(cfg_.precision.head_matmul));
  model.set_conv_products(recompute::parse_conv_products(cfg_.precision.conv_products));
  comm_.set_step(0);
  comm_.set_timeout(cfg_.comm.startup_timeout_s);  // Note [Deadlines]
  // Every rank starts from rank 0's weights.
  for (auto& p : model.parameters()) {
    auto d = p.data();
    comm_.broadcast(d, 0);
  }
  for (auto& b : model.buffers()) comm_.broadcast(b, 0);
  // The buckets before the optimizer: a sharded optimizer updates this rank's chunks of them.
  shard_ = world_ > 1 ? comm::parse_shard_stage(cfg_.memory.shard) : comm::ShardStage::kNone;
  params_ = model.parameters();
  clock_ = PhaseClock::for_device(device_);
  grad_sync_ = std::make_unique<comm::GradientSync>(params_, cfg_.comm.first_bucket_mb, cfg_.comm.bucket_mb,
                                                    cfg_.comm.overlap, shard_, world_, rank_,
                                                    cfg_.memory.grad_accum_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  // Note [Step timings on a GPU]: where the first bucket starts, on the device's timeline.
  if (clock_->on_device()) grad_sync_->set_first_bucket_hook([this] { first_bucket_mark_ = clock_->mark(); });
  optimizer_ = optim::make_run_optimizer(cfg_, model, *grad_sync_, comm_);
  scaler_ = std::make_unique<LossScaler>(cfg_.precision, precision_ == Precision::kFp16, device_);
  for (const auto& p : model.parameters()) param_bytes_ += static_cast<int64_t>(p.nbytes());
  check_budget();
  ckpt_dir_ = opt_.out_dir.empty() ? cfg_.checkpoint.dir : checkpoint_dir(cfg_, opt_.out_dir);
  start_from(opt_.start);
  open_outputs();
  if (world_ > 1) grad_sync_->allocate_buffers();  // persistent, so part of every step's base memory
  if (budget_ > 0) {
    meter_.set_budget(budget_);
    log::info("memory budget " + format_bytes(budget_) + " on " + meter_.device_name() + " (minimum " +
              format_bytes(budget_minimum_) + ")");
  }
}

Trainer::~Trainer() {
  // A background checkpoint write still reads the model and the optimizer: let it end. Its
  // error, if any, was or will never be reported: the run is being torn down already.
  if (writer_) try {
      writer_->wait();
    } catch (...) {
    }
}

// Note [Budget minimum]: what a step holds before its first activation: everything
// allocated now (parameters, buffers, any tensor a data set holds), the communication
// buffers (world > 1: one flat copy of the gradients, which then hold the gradients
// themselves), and the gradients (one rank) and the optimizer state the first step
// allocates, under memory.shard / memory.optimizer_state (model_state_bytes: the optimizer
// state / N, sharded gradients as this rank's chunks plus three buckets in flight, 8-bit
// moments). A budget below that cannot run a single sample; it is refused here, before the
// run writes anything.
void Trainer::check_budget() {
  budget_ = parse_bytes(cfg_.memory.budget);
  if (budget_ <= 0) return;
  // The buckets, if a sharded optimizer allocated them already, are counted as such below.
  const int64_t now = meter_.stats().current_bytes - grad_sync_->buffer_bytes();
  const auto mb = optim::model_state_bytes(cfg_, optim::parameter_numels(*parts_.model), world_);
  budget_minimum_ = now + mb.comm + mb.gradients + mb.optimizer;
  if (budget_ < budget_minimum_)
    throw ConfigError("memory.budget = " + bytes_text(budget_) + " is below the " + bytes_text(budget_minimum_) +
                      " this run holds before any activation (allocated now: " + format_bytes(now) +
                      ", of it parameters " + format_bytes(param_bytes_) + "; gradients " +
                      format_bytes(mb.gradients) + "; optimizer state " + format_bytes(mb.optimizer) +
                      (shard_ != comm::ShardStage::kNone || cfg_.memory.optimizer_state != "fp32"
                           ? " (memory.shard " + cfg_.memory.shard + ", memory.optimizer_state " +
                                 cfg_.memory.optimizer_state + ")"
                           : std::string()) +
                      (mb.comm > 0 ? "; communication buffers " + format_bytes(mb.comm) : std::string()) +
                      "); set memory.budget / --memory-budget to at least " + std::to_string(budget_minimum_) +
                      " bytes plus room for activations, or use a smaller model");
}

// Where the run starts: a full resume, weights only, or step 0.
void Trainer::start_from(const StartOptions& start) {
  auto& model = *parts_.model;
  if (!start.init_from.empty()) {
    // A checkpoint, a safetensors file or a Hugging Face directory (trainers/pretrained.h);
    // every name and shape is checked before anything is copied.
    const auto r = init_model(start.init_from, models::resolve_model(cfg_.model), model, start.init_skip_mismatched);
    for (const auto& note : r.notes) log::info(start.init_from + ": " + note);
    std::string msg = "initialised " + std::to_string(r.loaded) + " tensors from " + start.init_from + " (" +
                      r.description + "); fresh optimizer, step 0";
    if (!r.skipped.empty()) {
      msg += "; skipped " + std::to_string(r.skipped.size()) + " with another shape:";
      for (const auto& n : r.skipped) msg += "\n  " + n;
    }
    log::info(msg);
  }
  if (start.resume.empty()) return;
  auto c = load_for_resume(start.resume, ckpt_dir_, model, comm_, &resumed_from_);
  if (!c) return;
  const auto& t = cfg_.train;
  if (c->global_batch != t.global_batch)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) + ", but " + resumed_from_ +
                      " was trained with global batch " + std::to_string(c->global_batch) +
                      "; resuming needs the same global batch (--set train.global_batch=" +
                      std::to_string(c->global_batch) + ")");
  restore_state(*c, model, *optimizer_, *scaler_);
  start_step_ = c->step;
  std::string how = "resumed from " + resumed_from_ + " at step " + std::to_string(start_step_);
  if (c->world_size != world_ || c->accumulation != accum_)
    how += " (written by " + std::to_string(c->world_size) + " ranks x " + std::to_string(c->micro_batch) +
           " micro x " + std::to_string(c->accumulation) + " accumulation; now " + std::to_string(world_) + " x " +
           std::to_string(t.micro_batch) + " x " + std::to_string(accum_) + ", same global batch)";
  log::info(how);
}

const std::vector<int64_t>& Trainer::permutation(int64_t epoch) {
  if (epoch != perm_epoch_) {
    perm_ = data::epoch_permutation(parts_.train->size(), cfg_.data.seed, epoch);
    perm_epoch_ = epoch;
  }
  return perm_;
}

// Note [Prefetch]
// While micro-batch j runs forward and backward, a background thread (data::Prefetcher)
// builds the one after it: j + 1 of this step, or the first micro-batch of the next step,
// from the next epoch's permutation when that step starts an epoch. A batch is a pure
// function of (indices, epoch), so prefetching changes no sample and resume stays exact; the
// metrics' data_time_s is then the time the step waited for its batch. When the plan changes
// (an out-of-memory back-off re-slices the micro-batches) the wanted batch is not the one
// taken: take() builds the right one itself and drops the rest.
void Trainer::want_next_micro_batch(int64_t step, const std::vector<int64_t>& perm, int64_t j) {
  const int64_t epoch = step / steps_per_epoch_;
  if (j + 1 < accum_) {
    prefetch_->want(data::micro_batch_indices(perm, step % steps_per_epoch_, micro_, accum_, world_, rank_, j + 1),
                    epoch);
    return;
  }
  const int64_t next = step + 1, next_epoch = next / steps_per_epoch_, k = next % steps_per_epoch_;
  if (next >= total_steps_) return;
  if (next_epoch == epoch) {
    prefetch_->want(data::micro_batch_indices(perm, k, micro_, accum_, world_, rank_, 0), next_epoch);
  } else {
    const auto next_perm = data::epoch_permutation(parts_.train->size(), cfg_.data.seed, next_epoch);
    prefetch_->want(data::micro_batch_indices(next_perm, k, micro_, accum_, world_, rank_, 0), next_epoch);
  }
}

// Note [Out-of-memory back-off]: an out-of-memory error in a micro-batch (forward,
// backward, or a block's recompute) unwinds its scope, which frees its graph and batch.
// The rank still takes part in this step's gradient all-reduces: finish() starts the
// buckets the aborted backward did not (in bucket order, as on every rank), all_reduce()
// all of them when the last backward never began, so no peer is left waiting in a
// collective. The error travels as a flag in the step's one small all-reduce (loss,
// preemption, out of memory), before any update: every rank learns of it in the same
// step, drops the step's gradients, halves the micro-batch (doubles accumulation: the
// global batch is unchanged) and redoes the step from its first micro-batch. Global batch
// k holds the same samples whatever the micro-batch (data::micro_batch_indices), so no
// sample is lost or counted twice.
Trainer::MicroBatches Trainer::run_micro_batches(int64_t step, const std::vector<int64_t>& perm, int attempt) {
  MicroBatches mb;
  mb.loss_sum = zeros_double(device_);
  const int64_t epoch = step / steps_per_epoch_, k = step % steps_per_epoch_;
  try {
    for (int64_t j = 0; j < accum_; ++j) {
      const auto d0 = clock_->mark();
      auto batch = prefetch_->take(data::micro_batch_indices(perm, k, micro_, accum_, world_, rank_, j), epoch);
      clock_->add(PhaseClock::kData, d0, clock_->mark());
      want_next_micro_batch(step, perm, j);
      const auto c0 = clock_->mark();
      mb.tokens += batch.tokens;
      torch::manual_seed(micro_seed(cfg_.data.seed, step, rank_, j));
      torch::Tensor loss;
      {
        AutocastGuard ac(precision_, device_.type());
        const bool async = device_.is_cuda();  // pinned: Note [Pinned batches]
        const auto on = torch::TensorOptions().device(device_);
        loss = parts_.model->forward_loss_with(batch.input.to(on, async), batch.target.to(on, async),
                                               data::fields_on(batch, device_, async));
      }
      // The buckets' all-reduces start inside the last micro-batch's backward (comm.overlap);
      // with sharded gradients every micro-batch's buckets are reduce-scattered. GradientSync
      // arms where its stage synchronises (begin_backward / end_backward are no-ops elsewhere).
      if (world_ > 1) {
        grad_sync_->begin_backward(comm_, j == accum_ - 1);
        mb.backward_begun = j;
        if (j == accum_ - 1) mb.last_backward_begun = true;
      }
      inject_micro_batch_fault(*hooks_, step, rank_, j == accum_ - 1, attempt, loss);  // tests only
      // Gradients average over the whole global batch: world x accumulation micro-batches.
      scaler_->scale(loss / static_cast<double>(accum_ * world_)).backward();
      if (world_ > 1 && j < accum_ - 1) grad_sync_->end_backward(comm_);
      mb.loss_sum += loss.detach();
      clock_->add(PhaseClock::kCompute, c0, clock_->mark());
      mb.done = j + 1;
    }
  } catch (const c10::OutOfMemoryError& e) {
    if (!opt_.oom_backoff && world_ == 1) throw;  // the planner's probe: this candidate does not fit
    mb.oom = true;
    mb.oom_what = first_line(e);
    // What the partial step accumulated. Dropped, not zeroed: a bucket's all-reduce may
    // still be reading its buffer.
    optimizer_->zero_grad(/*set_to_none=*/true);
    // Sharded gradients: the peers reduce-scatter every micro-batch's buckets; this rank
    // issues the same collectives for the micro-batches it did not finish (zeros: the step is
    // redone anyway), the last one's begun for finish().
    if (world_ > 1 && shard_ == comm::ShardStage::kGradients)
      for (int64_t j = mb.done; j < accum_; ++j) {
        if (mb.backward_begun != j) grad_sync_->begin_backward(comm_, j == accum_ - 1);
        if (j < accum_ - 1) grad_sync_->end_backward(comm_);
        else mb.last_backward_begun = true;
      }
  }
  return mb;
}

// After every rank learnt that `ranks_oom` ranks ran out of memory: drop the step's sums and
// redo it with a smaller micro-batch (Note [Out-of-memory back-off]).
void Trainer::back_off(int64_t step, bool oom_here, const std::string& what, int64_t ranks_oom) {
  // In place under mpirun (every collective has ended), so the redo accumulates in the
  // buckets (Note [Gradients stay in the buckets]).
  optimizer_->zero_grad(/*set_to_none=*/!hold_grads_);
  grad_sync_->drop_shard_sums();
  const std::string who =
      oom_here ? "out of memory" : "out of memory on " + std::to_string(ranks_oom) + " other rank(s)";
  const std::string where = "step " + std::to_string(step + 1) + ": " + who + " with micro-batch " +
                            std::to_string(micro_) + (oom_here ? " (" + what + ")" : std::string());
  const int64_t next = backoff_micro_batch(micro_);
  if (!opt_.oom_backoff) throw TrainingStopped(where + "; no back-off (TrainerOptions::oom_backoff is off)");
  if (next == 0)
    throw TrainingStopped(where + "; micro-batch 1 does not fit: enable memory.recompute "
                          "(selective, full), use precision.mode = \"bf16\", or raise memory.budget");
  const int64_t next_accum = accum_ * (micro_ / next);
  log::warn(where + "; backing off to micro-batch " + std::to_string(next) + " x " + std::to_string(next_accum) +
            " accumulation (global batch " + std::to_string(cfg_.train.global_batch) + " unchanged) and redoing the step");
  metrics_->event("oom_backoff", {{"step", step + 1},
                                  {"old_micro_batch", micro_},
                                  {"old_accumulation", accum_},
                                  {"new_micro_batch", next},
                                  {"new_accumulation", next_accum},
                                  {"ranks", ranks_oom}});
  micro_ = next;
  accum_ = next_accum;
  cfg_.train.micro_batch = micro_;  // the checkpoints and the rest of the run use it
  meter_.reset_peak();              // the step's peak is the try that completes
}

// Note [Deadlines]: setup (broadcasts, resume), the first step (allocator warm-up, lazy
// initialisation), an evaluation (ranks may finish their shares apart) and the step after an
// evaluation or a checkpoint (rank 0 may still be writing) may be slow on one rank: those run
// under comm.startup_timeout_s; every other step under comm.timeout_s, so a dead or stuck
// peer is noticed in seconds, not hours.
void Trainer::set_step_deadline() {
  comm_.set_timeout(generous_step_ ? cfg_.comm.startup_timeout_s : cfg_.comm.timeout_s);
  generous_step_ = false;
}

double Trainer::set_learning_rate(int64_t step) {
  const double lr = lr_at(cfg_.train, step, total_steps_);
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  return lr;
}

// Note [Gradients stay in the buckets]: under mpirun every .grad is, after the first
// synchronisation, an alias of its slot in a persistent bucket buffer (Note [Gradients as
// bucket views] in comm/src/grad_sync.cpp). Zeroing in place keeps it so: backward then
// accumulates straight into the buckets, nothing is packed, and no second copy of the
// gradients is allocated each step (DDP's gradient_as_bucket_view, kept across steps).
// One rank has no buckets; there freeing the gradients keeps them out of the forward's peak.
void Trainer::zero_gradients() { optimizer_->zero_grad(/*set_to_none=*/!hold_grads_); }

// Once per optimizer step: one all-reduce per bucket, summing into .grad; the buckets began in
// the last backward (comm.overlap), unless an out-of-memory error came before it began.
void Trainer::reduce_gradients(const MicroBatches& mb) {
  if (world_ == 1) return;
  if (mb.last_backward_begun) grad_sync_->finish(comm_);
  else grad_sync_->all_reduce(comm_);
}

// The step's loss, the preemption flag and the out-of-memory flag travel together, before
// the update: one small all-reduce, and every rank learns in the same step that some rank
// was asked to stop, ran out of memory, or that the loss is not finite (Note [Non-finite
// loss]). Sets r.loss and r.stop; returns how many ranks ran out of memory.
int64_t Trainer::agree_on_step(const MicroBatches& mb, StepResult& r) {
  const torch::Tensor loss_sum = mb.oom ? zeros_double(device_) : mb.loss_sum;
  auto flags = torch::tensor({preemption_requested() ? 1.0 : 0.0, mb.oom ? 1.0 : 0.0}, loss_sum.options());
  auto reduced = torch::cat({(loss_sum / static_cast<double>(accum_ * world_)).reshape({1}), flags});
  if (world_ > 1) comm_.allreduce_sum(reduced);
  reduced = reduced.cpu();
  r.loss = reduced[0].item<double>();
  r.stop = reduced[1].item<double>() > 0;
  return static_cast<int64_t>(std::lround(reduced[2].item<double>()));
}

StepResult Trainer::train_step(int64_t step) {
  StepResult r;
  r.step = step + 1;
  r.epoch = step / steps_per_epoch_;
  const auto& perm = permutation(r.epoch);
  comm_.set_step(step + 1);
  set_step_deadline();
  StepTelemetry telemetry(*this, r);  // the step's clock and memory peak start here
  r.lr = set_learning_rate(step);
  zero_gradients();
  telemetry.base_memory();
  for (int attempt = 0;; ++attempt) {
    telemetry.try_begins();
    const MicroBatches mb = run_micro_batches(step, perm, attempt);
    telemetry.micro_batches_ran(mb);
    const auto u0 = telemetry.reduction_begins();
    reduce_gradients(mb);
    telemetry.gradients_reduced(mb, u0);
    const int64_t ranks_oom = agree_on_step(mb, r);
    telemetry.add_update_time(u0);
    if (ranks_oom == 0) break;
    back_off(step, mb.oom, mb.oom_what, ranks_oom);
  }
  const auto u1 = clock_->mark();
  telemetry.before_update();
  r.nonfinite_loss = nonfinite_.skip_update(step + 1, r.loss, ckpt_dir_);
  r.applied = !r.nonfinite_loss && apply_update(*optimizer_, *scaler_, params_, cfg_.train.grad_clip, comm_);
  telemetry.add_update_time(u1);
  telemetry.done();
  return r;
}

TrainSummary Trainer::run() {
  install_preemption_handlers();
  log_start();
  progress_ = std::make_unique<Progress>(cfg_.log.progress, total_steps_, cfg_.log.every_steps, rank_ == 0);
  const auto run_start = Clock::now();
  epoch_start_ = Clock::now();
  for (int64_t step = start_step_; step < total_steps_; ++step) {
    hooks_->step_begin(step + 1, rank_);
    const StepResult r = train_step(step);
    record_step(r);
    maybe_checkpoint(r);
    if (r.stop) {
      progress_->interrupt();
      writer_->wait();
      summary_.preempted = true;
      log::info("preempted by signal " + std::to_string(preemption_signal()) + " after step " +
                std::to_string(r.step) + ": checkpoint written; resume with --resume auto");
      break;
    }
    if (step % steps_per_epoch_ == steps_per_epoch_ - 1 || r.step == total_steps_) end_epoch(r.epoch, step);
    hooks_->step_end(r.step);
  }
  hooks_->run_end();
  writer_->wait();
  summary_.seconds = seconds_since(run_start);
  return summary_;
}

TrainSummary run_training(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm,
                          const std::string& out_dir, const StartOptions& start) {
  TrainerOptions opt;
  opt.out_dir = out_dir;
  opt.start = start;
  opt.hooks = hooks_from_env(comm.size());
  // Note [Setup agreement] (comm/src/agreement.cpp): a model or data error on one rank stops every rank.
  Components parts = comm::agreed_setup(comm, device_of(ctx), [&] { return make_components(cfg); });
  Trainer trainer(cfg, std::move(parts), ctx, comm, std::move(opt));
  return trainer.run();
}

}  // namespace lt::trainers
