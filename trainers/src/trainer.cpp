#include "leantrain/trainers/trainer.h"
#include "leantrain/trainers/sharded_optimizer.h"

#include <c10/util/Exception.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "leantrain/data/data.h"
#include "leantrain/data/registry.h"
#include "leantrain/recompute/recompute.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/trainers/faults.h"
#include "leantrain/trainers/optimizer.h"
#include "leantrain/trainers/pretrained.h"
#include "leantrain/trainers/schedule.h"

namespace lt::trainers {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The process's peak resident set so far (getrusage; Linux reports KiB). On the CPU this is
// the one memory figure a Python peer can report the same way (bench/peers/, docs/BENCH_PEERS.md).
int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

// Note [Randomness per micro-batch]
// Dropout draws from the global generator, reseeded before every micro-batch from
// (seed, step, rank, micro-batch index): a resumed run repeats an uninterrupted one, and
// no rank's stream depends on how many micro-batches another rank ran.
uint64_t micro_seed(uint64_t seed, int64_t step, int rank, int64_t micro) {
  return data::mix_seed({seed, 0x5eedULL, static_cast<uint64_t>(step), static_cast<uint64_t>(rank),
                         static_cast<uint64_t>(micro)});
}

std::string bytes_text(int64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

/// The first line of a LibTorch message, without its C++ context.
std::string first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  const auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

torch::Tensor zeros_double(const torch::Device& device) {
  return torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

// An injected storage fault (ckpt_fail / ckpt_kill): writes `c` on this thread while no
// file may grow past half its tensor bytes, so the write fails (or the process dies) midway.
void write_under_storage_fault(CheckpointWriter& writer, const checkpoint_io::Checkpoint& c, bool kill,
                               Clock::time_point since) {
  int64_t bytes = 0;
  for (const auto* group : {&c.model, &c.optimizer})
    for (const auto& nt : *group) bytes += static_cast<int64_t>(nt.tensor.nbytes());
  writer.wait();  // the limit is process-wide: not on the write of an earlier checkpoint
  FileSizeFault limit(std::max<int64_t>(bytes / 2, 4096), kill);
  writer.write_now(c, since);
}

void check_components(const Components& c) {
  if (!c.model) throw ConfigError("Trainer: Components.model is null: give the model to train");
  if (!c.train) throw ConfigError("Trainer: Components.train is null: give a training set");
  if (c.train->size() <= 0) throw ConfigError("Trainer: the training set is empty (" + c.train->describe() + ")");
}

}  // namespace

Config resolve_components(const Config& cfg) {
  Config out = cfg;
  out.model = models::resolve_model(cfg.model);
  out.data = data::resolve_data(cfg.data);
  return out;
}

std::string registered_options_markdown() {
  std::string md;
  for (const auto& name : models::model_kind_names()) {
    const auto& k = models::model_kind(name);
    md += options_markdown("model", k.name, k.doc, k.options) + "\n";
  }
  for (const auto& name : data::data_kind_names()) {
    const auto& k = data::data_kind(name);
    md += options_markdown("data", k.name, k.doc, k.options) + "\n";
  }
  return md;
}

void check_component_config(const Config& cfg) {
  (void)resolve_components(cfg);
  models::RecomputePolicy::parse(cfg.memory.activation_checkpoint);
}

Components make_components(const Config& cfg) {
  const Config c = resolve_components(cfg);
  models::RecomputePolicy::parse(c.memory.activation_checkpoint);
  MemoryMeter::install_cpu_tracking();  // before the first parameter (Note [Memory breakdown])
  torch::manual_seed(static_cast<uint64_t>(c.data.seed));  // same initial weights on every rank
  auto data = data::make_datasets(c.data, models::model_contract(c.model));
  return Components{models::build_model(c.model), data.train, data.eval, "model " + c.model.kind};
}

// What the micro-batches of one try of a step left behind (Note [Out-of-memory back-off]).
struct Trainer::MicroBatches {
  torch::Tensor loss_sum;  // on the device: one host sync per step
  int64_t tokens = 0;
  double data_s = 0, compute_s = 0;
  bool last_backward_begun = false, oom = false;
  int64_t done = 0;             // micro-batches whose backward completed
  int64_t backward_begun = -1;  // the last micro-batch begin_backward() was called for
  std::string oom_what;
};

Trainer::Trainer(const Config& cfg, Components components, const RuntimeContext& ctx, comm::Communicator& comm,
                 TrainerOptions opt)
    : cfg_(cfg),
      parts_(std::move(components)),
      ctx_(ctx),
      comm_(comm),
      opt_(std::move(opt)),
      hooks_(opt_.hooks ? opt_.hooks : std::make_shared<TrainerHooks>()),
      device_(ctx.on_cuda() ? torch::Device(torch::kCUDA, ctx.device_index) : torch::Device(torch::kCPU)),
      meter_(ctx.device_index),
      nonfinite_(cfg.train.nonfinite, cfg.train.nonfinite_max_skips, cfg.precision.mode == "fp16"),
      schedule_{cfg.checkpoint.every_steps, cfg.checkpoint.at_end},
      world_(comm.size()),
      rank_(comm.rank()) {
  check_components(parts_);
  const auto& t = cfg_.train;
  if (t.micro_batch <= 0 || t.global_batch % (t.micro_batch * world_) != 0)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) + " must be a multiple of " +
                      std::to_string(world_) + " ranks x train.micro_batch " + std::to_string(t.micro_batch));
  check_precision_supported(cfg_.precision.mode, device_);
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
  prefetch_ = std::make_unique<data::Prefetcher>(parts_.train);

  auto& model = *parts_.model;
  model.to(device_);
  model.train();
  model.apply_recompute(models::RecomputePolicy::parse(cfg_.memory.activation_checkpoint));
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
  grad_sync_ = std::make_unique<comm::GradientSync>(params_, cfg_.comm.first_bucket_mb, cfg_.comm.bucket_mb,
                                                    cfg_.comm.overlap, shard_, world_, rank_,
                                                    cfg_.memory.grad_accum_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
  optimizer_ = make_run_optimizer(cfg_, model, *grad_sync_, comm_);
  scaler_ = std::make_unique<LossScaler>(cfg_.precision, cfg_.precision.mode == "fp16", device_);
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
  const auto mb = model_state_bytes(cfg_, parameter_numels(*parts_.model), world_);
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

namespace {

// Model::compute_note at the run's device and precision.
std::string compute_note(const Config& cfg, const models::Model& model, const c10::Device& device) {
  const auto dtype = cfg.precision.mode == "bf16" ? c10::kBFloat16
                     : cfg.precision.mode == "fp16" ? c10::kHalf
                                                    : c10::kFloat;
  return model.compute_note(device, dtype);
}

}  // namespace

// config.json, metrics.jsonl (a resumed run appends to the metrics of the run it continues)
// and the checkpoint writer, whose completion events come from its own thread (MetricsWriter
// is thread-safe).
void Trainer::open_outputs() {
  const bool files = !opt_.out_dir.empty();
  if (files && rank_ == 0) {
    files::make_dirs(opt_.out_dir);
    // Note [What ran]: the resolved config, plus what the runtime chose for it on this machine
    // (GPT/BERT: the attention kernel LibTorch picks), under "runtime" (read by people and
    // tools; a config file has no such section).
    auto j = nlohmann::json::parse(config_to_json(cfg_));
    j["runtime"] = {{"device", device_.str()}, {"compute", compute_note(cfg_, *parts_.model, device_)}};
    files::write_atomic(files::join(opt_.out_dir, "config.json"), j.dump(2) + "\n");
  }
  metrics_ = std::make_unique<MetricsWriter>(files ? files::join(opt_.out_dir, "metrics.jsonl") : std::string(),
                                             files && rank_ == 0, !resumed_from_.empty());
  if (!opt_.start.plan_event.empty()) metrics_->event("plan", opt_.start.plan_event);
  if (!resumed_from_.empty())
    metrics_->event("resume",
                    {{"step", start_step_}, {"path", resumed_from_}, {"world_size", static_cast<int64_t>(world_)}});
  auto* metrics = metrics_.get();
  writer_ = std::make_unique<CheckpointWriter>(
      ckpt_dir_, cfg_.checkpoint.keep_last, cfg_.checkpoint.async,
      [metrics](const std::string& path, const checkpoint_io::WriteStats& ws, double stall_s) {
        metrics->event("checkpoint",
                       {{"path", path}, {"bytes", ws.bytes}, {"seconds", ws.seconds}, {"stall_s", stall_s}});
        log::info("checkpoint " + path + ": " + format_bytes(ws.bytes) + " in " + std::to_string(ws.seconds) + " s");
      });
}

void Trainer::log_start() const {
  const auto& t = cfg_.train;
  log::info(parts_.name + ": " + std::to_string(models::count_parameters(*parts_.model)) +
            " parameters; " + parts_.train->describe());
  // The kernels the model runs here (GPT/BERT: the attention LibTorch picks), once.
  const std::string note = compute_note(cfg_, *parts_.model, device_);
  if (!note.empty()) log::info(parts_.name + ": " + note);
  log::info("device " + ctx_.device_string() + ", " + std::to_string(ctx_.threads) + " threads, world " +
            std::to_string(world_) + ", precision " + cfg_.precision.mode + "; global batch " +
            std::to_string(t.global_batch) + " = " + std::to_string(world_) + " ranks x " +
            std::to_string(t.micro_batch) + " micro x " + std::to_string(accum_) +
            " accumulation; recompute " +
            models::RecomputePolicy::parse(cfg_.memory.activation_checkpoint).to_string() + "; shard " +
            comm::to_string(shard_) +
            (shard_ == comm::ShardStage::kGradients ? " (" + cfg_.memory.grad_accum_dtype + " gradient sums)" : "") +
            ", optimizer state " + cfg_.memory.optimizer_state + "; " +
            std::to_string(total_steps_) + " steps (" + std::to_string(steps_per_epoch_) + " per epoch)");
  if (lr_scale(t) != 1.0)
    log::info("linear lr scaling: train.lr " + std::to_string(t.lr) + " x global batch " +
              std::to_string(t.global_batch) + " / train.lr_reference_batch " + std::to_string(t.lr_reference_batch) +
              " = " + std::to_string(t.lr * lr_scale(t)));
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
      const auto d0 = Clock::now();
      auto batch = prefetch_->take(data::micro_batch_indices(perm, k, micro_, accum_, world_, rank_, j), epoch);
      mb.data_s += seconds_since(d0);
      want_next_micro_batch(step, perm, j);
      const auto c0 = Clock::now();
      mb.tokens += batch.tokens;
      torch::manual_seed(micro_seed(cfg_.data.seed, step, rank_, j));
      torch::Tensor loss;
      {
        AutocastGuard ac(cfg_.precision.mode, device_.type());
        loss = parts_.model->forward_loss_with(batch.input.to(device_), batch.target.to(device_),
                                               data::fields_on(batch, device_));
      }
      if (hooks_->nan_loss(step + 1, rank_)) loss = loss * std::numeric_limits<double>::quiet_NaN();
      // The buckets' all-reduces start inside the last micro-batch's backward (comm.overlap);
      // with sharded gradients every micro-batch's buckets are reduce-scattered. GradientSync
      // arms where its stage synchronises (begin_backward / end_backward are no-ops elsewhere).
      if (world_ > 1) {
        grad_sync_->begin_backward(comm_, j == accum_ - 1);
        mb.backward_begun = j;
        if (j == accum_ - 1) mb.last_backward_begun = true;
      }
      if (j == accum_ - 1 && attempt == 0 && hooks_->oom_in_last_micro_batch(step + 1, rank_))
        TORCH_CHECK_WITH(OutOfMemoryError, false, "injected out of memory (LEANTRAIN_FAULT oom@", step + 1, ")");
      // Gradients average over the whole global batch: world x accumulation micro-batches.
      scaler_->scale(loss / static_cast<double>(accum_ * world_)).backward();
      if (world_ > 1 && j < accum_ - 1) grad_sync_->end_backward(comm_);
      mb.loss_sum += loss.detach();
      mb.compute_s += seconds_since(c0);
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

StepResult Trainer::train_step(int64_t step) {
  StepResult r;
  r.step = step + 1;
  r.epoch = step / steps_per_epoch_;
  const auto& perm = permutation(r.epoch);
  comm_.set_step(step + 1);
  // Note [Deadlines]: setup (broadcasts, resume), the first step (allocator warm-up, lazy
  // initialisation), an evaluation (ranks may finish their shares apart) and the step after an
  // evaluation or a checkpoint (rank 0 may still be writing) may be slow on one rank: those run
  // under comm.startup_timeout_s; every other step under comm.timeout_s, so a dead or stuck
  // peer is noticed in seconds, not hours.
  comm_.set_timeout(generous_step_ ? cfg_.comm.startup_timeout_s : cfg_.comm.timeout_s);
  generous_step_ = false;
  const auto step_start = Clock::now();
  meter_.reset_peak();
  r.lr = lr_at(cfg_.train, step, total_steps_);
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(r.lr);
  // Note [Gradients stay in the buckets]: under mpirun every .grad is, after the first
  // synchronisation, an alias of its slot in a persistent bucket buffer (Note [Gradients as
  // bucket views] in comm/src/grad_sync.cpp). Zeroing in place keeps it so: backward then
  // accumulates straight into the buckets, nothing is packed, and no second copy of the
  // gradients is allocated each step (DDP's gradient_as_bucket_view, kept across steps).
  // One rank has no buckets; there freeing the gradients keeps them out of the forward's peak.
  optimizer_->zero_grad(/*set_to_none=*/!hold_grads_);
  // Note [Memory breakdown]: what is allocated at the start of a step is parameters +
  // optimizer state + gradient buckets (holding the zeroed gradients under mpirun) + the rest
  // ("other": model buffers, the batch, and the background checkpoint writer's snapshot
  // while it writes); the step's peak above that is the gradients outside the buckets plus
  // the activations of one micro-batch. Optimizer state is summed over its tensors, so a
  // checkpoint snapshot is not counted as such.
  const comm::CommStats stats_at_start = comm_.stats();
  r.base_bytes = meter_.stats().current_bytes;
  r.optimizer_bytes = optimizer_state_allocated_bytes(*optimizer_);
  r.other_bytes = std::max<int64_t>(0, r.base_bytes - param_bytes_ - r.optimizer_bytes - grad_sync_->buffer_bytes());

  for (int attempt = 0;; ++attempt) {
    const int64_t calls_at_start = comm_.stats().allreduce_calls;
    MicroBatches mb = run_micro_batches(step, perm, attempt);
    r.data_time_s += mb.data_s;
    r.compute_s += mb.compute_s;
    const auto u0 = Clock::now();
    // Collectives issued while the micro-batches ran, besides the gradient buckets started in
    // the last backward (must be none: accumulation is local).
    // (Sharded: the buckets' reduce-scatters are counted as such, not as all-reduces.)
    r.calls_in_microbatches = comm_.stats().allreduce_calls - calls_at_start -
                              (mb.last_backward_begun && shard_ == comm::ShardStage::kNone
                                   ? grad_sync_->last_times().started_in_backward
                                   : 0);
    if (world_ > 1) {  // once per optimizer step: one all-reduce per bucket, sums into .grad
      if (mb.last_backward_begun) grad_sync_->finish(comm_);
      else grad_sync_->all_reduce(comm_);  // out of memory before the last backward began
      r.comm_time_s = grad_sync_->last_times().comm_s;
      r.comm_exposed_s = grad_sync_->last_times().exposed_s;
      r.buckets_in_backward = mb.last_backward_begun ? grad_sync_->last_times().started_in_backward : 0;
    }
    r.grad_allreduce_calls = comm_.stats().allreduce_calls - calls_at_start - r.calls_in_microbatches;
    // The step's loss, the preemption flag and the out-of-memory flag travel together, before
    // the update: one small all-reduce, and every rank learns in the same step that some rank
    // was asked to stop, ran out of memory, or that the loss is not finite (Note [Non-finite loss]).
    if (mb.oom) mb.loss_sum = zeros_double(device_);
    auto flags = torch::tensor({preemption_requested() ? 1.0 : 0.0, mb.oom ? 1.0 : 0.0}, mb.loss_sum.options());
    auto reduced = torch::cat({(mb.loss_sum / static_cast<double>(accum_ * world_)).reshape({1}), flags});
    if (world_ > 1) comm_.allreduce_sum(reduced);
    reduced = reduced.cpu();
    r.loss = reduced[0].item<double>();
    r.stop = reduced[1].item<double>() > 0;
    const auto ranks_oom = static_cast<int64_t>(std::lround(reduced[2].item<double>()));
    r.update_s += seconds_since(u0);
    if (ranks_oom == 0) break;
    back_off(step, mb.oom, mb.oom_what, ranks_oom);
  }
  const auto u1 = Clock::now();
  r.micro_batch = micro_;
  r.accumulation = accum_;
  for (const auto& p : params_)  // gradients in the buckets are counted as buckets
    if (p.grad().defined() && !grad_sync_->in_buckets(p.grad())) r.grad_bytes += static_cast<int64_t>(p.grad().nbytes());
  r.loss_scale = scaler_->scale_value();
  r.nonfinite_loss = nonfinite_.skip_update(step + 1, r.loss, ckpt_dir_);
  r.applied = !r.nonfinite_loss && apply_update(*optimizer_, *scaler_, params_, cfg_.train.grad_clip, comm_);
  r.update_s += seconds_since(u1);
  const comm::CommStats& now = comm_.stats();
  r.grad_reduce_scatter_calls = now.reduce_scatter_calls - stats_at_start.reduce_scatter_calls;
  r.param_allgather_calls = now.allgather_calls - stats_at_start.allgather_calls;
  const double ring = world_ > 1 ? static_cast<double>(world_ - 1) / world_ : 0.0;
  r.comm_bytes = static_cast<int64_t>(
      ring * (2.0 * static_cast<double>(now.allreduce_bytes - stats_at_start.allreduce_bytes) +
              static_cast<double>(now.reduce_scatter_bytes - stats_at_start.reduce_scatter_bytes) +
              static_cast<double>(now.allgather_bytes - stats_at_start.allgather_bytes)));
  r.step_time_s = seconds_since(step_start);
  r.peak_bytes = meter_.stats().peak_bytes;
  return r;
}

// The sums of the eval samples [lo, hi) in batches of `bs`: loss, counted targets, correct.
static torch::Tensor eval_sums(models::Model& model, const data::Dataset& ds, const std::string& precision,
                               const torch::Device& device, int64_t epoch, int64_t lo, int64_t hi, int64_t bs) {
  torch::NoGradGuard no_grad;
  auto acc = torch::zeros({3}, torch::TensorOptions().dtype(torch::kDouble).device(device));
  for (int64_t start = lo; start < hi; start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(hi, start + bs); ++i) idx.push_back(i);
    auto batch = ds.get(idx, epoch);
    auto input = batch.input.to(device), target = batch.target.to(device);
    torch::Tensor logits;
    {
      AutocastGuard ac(precision, device.type());
      logits = model.forward_with(input, data::fields_on(batch, device));
    }
    auto flat = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
    auto tgt = target.reshape({-1});
    auto valid = tgt != models::kIgnoreIndex;
    auto losses = torch::nn::functional::cross_entropy(
        flat, tgt,
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(models::kIgnoreIndex).reduction(torch::kSum));
    acc[0] += losses.to(torch::kDouble);
    acc[1] += valid.sum().to(torch::kDouble);
    acc[2] += (flat.argmax(-1).eq(tgt) & valid).sum().to(torch::kDouble);
  }
  return acc;
}

// Each rank evaluates its contiguous share of the eval samples; the sums are all-reduced, so
// N ranks take about 1/N of the time and agree on one result (equal to one rank's up to the
// order of the fp64 sums). Under a memory budget an out-of-memory error halves this rank's
// evaluation batch and starts its share over (the sums do not depend on the batch size);
// eval_batch_ keeps the batch that fitted for the next evaluation.
std::optional<EvalResult> Trainer::evaluate(int64_t epoch) {
  if (!parts_.eval) return std::nullopt;
  const auto& t = cfg_.train;
  // eval_max_batches counts batches of train.eval_batch, whatever batch an out-of-memory
  // back-off runs with: the same samples are evaluated.
  const int64_t size = parts_.eval->size();
  const int64_t n = t.eval_max_batches > 0 ? std::min(size, t.eval_max_batches * t.eval_batch) : size;
  const int64_t lo = n * rank_ / world_, hi = n * (rank_ + 1) / world_;
  const auto t0 = Clock::now();
  auto& model = *parts_.model;
  if (world_ > 1) {
    // Every share is evaluated with rank 0's buffers (BatchNorm's running statistics, which
    // each rank updates from its own micro-batches): the result is that of the model rank 0
    // checkpoints, as DDP's broadcast_buffers makes it. Training reads no running statistics,
    // so the steps after are unchanged.
    comm_.set_timeout(cfg_.comm.startup_timeout_s);  // shares may take unequal times (Note [Deadlines])
    for (auto& b : model.buffers()) comm_.broadcast(b, 0);
  }
  model.eval();
  torch::Tensor acc;
  for (;;) {
    try {
      acc = eval_sums(model, *parts_.eval, cfg_.precision.mode, device_, epoch, lo, hi, eval_batch_);
      break;
    } catch (const c10::OutOfMemoryError& e) {
      if (eval_batch_ == 1) {
        model.train();
        throw std::runtime_error("evaluation: out of memory with evaluation batch 1 (" + first_line(e) +
                                 "); raise memory.budget");
      }
      log::warn("evaluation: out of memory with evaluation batch " + std::to_string(eval_batch_) +
                "; retrying with " + std::to_string(eval_batch_ / 2));
      eval_batch_ /= 2;
    }
  }
  model.train();
  if (world_ > 1) comm_.allreduce_sum(acc);
  const auto totals = acc.cpu();
  const double loss_sum = totals[0].item<double>(), count = totals[1].item<double>(),
               correct = totals[2].item<double>();
  EvalResult r;
  r.shard_samples = hi - lo;
  r.seconds = seconds_since(t0);
  r.loss = count > 0 ? loss_sum / count : 0;
  if (model.task() != models::Task::kCausalLM) r.accuracy = count > 0 ? correct / count : 0;
  return r;
}

void Trainer::maybe_checkpoint(const StepResult& r) {
  if (!schedule_.due(r.step, total_steps_, r.stop)) return;
  generous_step_ = true;  // rank 0 may still be writing when the next step starts
  if (ckpt_dir_.empty()) return;
  const auto c0 = Clock::now();
  // Sharded optimizer state is gathered to rank 0 by every rank (Note [Sharded checkpoints]).
  // That state, and 8-bit moments dequantised, is built in host memory for the write: on a
  // GPU outside the device's budget, so on the CPU, where the budget stands for a device's
  // memory, outside it too (the tracking allocator's limit is lifted until the file is
  // written; the process's peak RSS includes it).
  auto* sharded = dynamic_cast<ShardedOptimizer*>(optimizer_.get());
  struct LiftBudget {
    MemoryMeter& meter;
    int64_t budget;
    ~LiftBudget() {
      if (budget > 0) meter.set_budget(budget);
    }
  } lift{meter_, sharded && budget_ > 0 && !ctx_.on_cuda() ? budget_ : 0};
  if (lift.budget > 0) meter_.set_budget(0);
  std::optional<std::vector<checkpoint_io::NamedTensor>> gathered;
  if (sharded && sharded->sharded()) gathered = sharded->full_state(named_parameters_of(*parts_.model), 0);
  if (rank_ != 0) return;
  const auto fault = hooks_->checkpoint_fault(r.step, rank_);
  // Note [Checkpoints under a CPU budget]: the background writer's copy of the state
  // (parameters + optimizer state) lives in the memory the budget limits on the CPU (on a
  // GPU it is host memory, outside the budget); with a CPU budget the write is synchronous
  // from the live tensors instead.
  const bool copy = writer_->async() && fault == CheckpointFault::kNone && !(budget_ > 0 && !ctx_.on_cuda());
  auto c = capture_state(cfg_, world_, *parts_.model, *optimizer_, *scaler_, r.step, steps_per_epoch_, copy,
                         gathered ? &*gathered : nullptr);
  if (fault != CheckpointFault::kNone) write_under_storage_fault(*writer_, c, fault == CheckpointFault::kKill, c0);
  else if (!copy) writer_->write_now(c, c0);
  else writer_->submit(std::move(c), c0);
}

void Trainer::record_step(const StepResult& r) {
  const auto& t = cfg_.train;
  if (!r.applied) {
    if (r.nonfinite_loss) log::warn("step " + std::to_string(r.step) + ": non-finite loss, update skipped");
    metrics_->event("skipped_step", {{"step", r.step},
                                     {"reason", std::string(r.nonfinite_loss ? "non-finite loss" : "non-finite gradient")},
                                     {"loss_scale", r.loss_scale},
                                     {"new_loss_scale", scaler_->scale_value()}});
  }
  epoch_peak_ = std::max(epoch_peak_, r.peak_bytes);
  epoch_act_peak_ = std::max(epoch_act_peak_, r.activation_bytes());
  epoch_samples_ += t.global_batch;
  summary_.peak_mem_bytes = std::max(summary_.peak_mem_bytes, r.peak_bytes);
  const double sps = static_cast<double>(t.global_batch) / r.step_time_s;
  MetricFields f = {{"step", r.step},
                    {"epoch", r.epoch},
                    {"loss", r.loss},
                    {"lr", r.lr},
                    {"loss_scale", r.loss_scale},
                    {"samples_per_s", sps},
                    {"step_time_s", r.step_time_s},
                    {"data_time_s", r.data_time_s},
                    {"comm_time_s", r.comm_time_s},
                    {"comm_exposed_s", r.comm_exposed_s},
                    {"comm_calls_in_microbatches", r.calls_in_microbatches},
                    {"grad_allreduce_calls", r.grad_allreduce_calls},
                    {"grad_buckets", static_cast<int64_t>(grad_sync_->num_buckets())},
                    {"grad_reduce_scatter_calls", r.grad_reduce_scatter_calls},
                    {"param_allgather_calls", r.param_allgather_calls},
                    {"comm_bytes", r.comm_bytes},
                    {"peak_mem_bytes", r.peak_bytes},
                    {"peak_rss_bytes", peak_rss_bytes()},
                    {"micro_batch", r.micro_batch},
                    {"accumulation", r.accumulation},
                    {"mem_params_bytes", param_bytes_},
                    {"mem_grads_bytes", r.grad_bytes},
                    {"mem_optimizer_bytes", r.optimizer_bytes},
                    {"mem_comm_buffers_bytes", grad_sync_->buffer_bytes()},
                    {"mem_other_bytes", r.other_bytes},
                    {"mem_activations_bytes", r.activation_bytes()}};
  if (r.tokens > 0) f.emplace_back("tokens_per_s", static_cast<double>(r.tokens * world_) / r.step_time_s);
  metrics_->event("step", f);
  progress_->update(r.step, r.loss, r.lr, sps);
  summary_.final_loss = r.loss;
  summary_.steps = r.step;
}

// The evaluation and the epoch event after the last step of an epoch (`step`, 0-based).
void Trainer::end_epoch(int64_t epoch, int64_t step) {
  generous_step_ = true;  // ranks may finish the evaluation apart
  progress_->interrupt();
  const double epoch_time = seconds_since(epoch_start_);
  const auto ev = evaluate(epoch);
  summary_.epochs = epoch + 1;
  MetricFields ef = {{"epoch", epoch}, {"step", step + 1}};
  std::ostringstream line;
  line.precision(4);
  line << std::fixed << "epoch " << epoch + 1 << ":";
  if (ev) {
    summary_.evaluated = true;
    summary_.eval_loss = ev->loss;
    summary_.eval_accuracy = ev->accuracy;
    ef.emplace_back("eval_loss", ev->loss);
    ef.emplace_back("eval_time_s", ev->seconds);
    ef.emplace_back("eval_shard_samples", ev->shard_samples);
    line << " eval loss " << ev->loss;
    if (ev->accuracy >= 0) {
      ef.emplace_back("eval_accuracy", ev->accuracy);
      line << ", accuracy " << 100.0 * ev->accuracy << "%";
    }
    if (parts_.model->task() != models::Task::kClassify) {
      ef.emplace_back("eval_perplexity", std::exp(ev->loss));
      line << ", perplexity " << std::exp(ev->loss);
    }
  } else {
    line << " no eval set";
  }
  const double sps = static_cast<double>(epoch_samples_) / epoch_time;
  for (MetricFields::value_type kv : MetricFields{{"epoch_time_s", epoch_time},
                                                 {"samples_per_s", sps},
                                                 {"peak_mem_bytes", epoch_peak_},
                                                 {"peak_rss_bytes", peak_rss_bytes()},
                                                 {"mem_params_bytes", param_bytes_},
                                                 {"mem_activations_bytes", epoch_act_peak_}})
    ef.push_back(std::move(kv));
  line.precision(1);
  line << "; " << epoch_time << " s, " << sps << " samples/s, peak memory " << format_bytes(epoch_peak_)
       << " (parameters " << format_bytes(param_bytes_) << ", activations " << format_bytes(epoch_act_peak_) << ")";
  metrics_->event("epoch", ef);
  log::info(line.str());
  epoch_start_ = Clock::now();
  epoch_peak_ = epoch_act_peak_ = epoch_samples_ = 0;
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
  Trainer trainer(cfg, make_components(cfg), ctx, comm, std::move(opt));
  return trainer.run();
}

}  // namespace lt::trainers
