#include "leantrain/trainers/trainer.h"

#include <c10/util/Exception.h>
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <sstream>

#include "leantrain/comm/grad_sync.h"
#include "leantrain/data/data.h"
#include "leantrain/models/activation_checkpoint.h"
#include "leantrain/models/model.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/faults.h"
#include "leantrain/trainers/metrics.h"
#include "leantrain/trainers/optimizer.h"
#include "leantrain/trainers/precision.h"
#include "leantrain/trainers/progress.h"
#include "leantrain/trainers/schedule.h"
#include "leantrain/trainers/turns.h"

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

}  // namespace

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainConfig& t, torch::nn::Module& model) {
  // Weight decay on matrices and conv kernels only, not on biases and norm scales (the
  // GPT-2/BERT convention every peer recipe follows).
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model.parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto build = [&](auto options_for) {
    using Options = typename decltype(options_for(0.0))::element_type;
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options_for(t.weight_decay));
    groups.emplace_back(no_decay, options_for(0.0));
    return std::make_pair(std::move(groups), Options(t.lr));
  };
  if (t.optimizer == "adamw") {
    auto [groups, defaults] = build([&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(t.lr).betas({t.beta1, t.beta2}).eps(t.eps).weight_decay(wd));
    });
    return std::make_unique<ChunkedAdamW>(std::move(groups), defaults);
  }
  auto [groups, defaults] = build([&](double wd) {
    return std::make_unique<torch::optim::SGDOptions>(torch::optim::SGDOptions(t.lr).momentum(t.momentum).weight_decay(wd));
  });
  return std::make_unique<torch::optim::SGD>(std::move(groups), defaults);
}

int64_t optimizer_state_bytes(const TrainConfig& t, int64_t param_bytes) {
  if (t.optimizer == "adamw") return 2 * param_bytes;
  return t.momentum != 0 ? param_bytes : 0;
}

int64_t optimizer_state_allocated_bytes(torch::optim::Optimizer& optimizer) {
  int64_t bytes = 0;
  auto add = [&](const torch::Tensor& x) {
    if (x.defined()) bytes += static_cast<int64_t>(x.nbytes());
  };
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* a = dynamic_cast<torch::optim::AdamWParamState*>(state.get())) {
      add(a->exp_avg());
      add(a->exp_avg_sq());
      add(a->max_exp_avg_sq());
    } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(state.get())) {
      add(m->momentum_buffer());
    }
  }
  return bytes;
}

namespace {

std::string bytes_text(int64_t b) { return format_bytes(b) + " (" + std::to_string(b) + " bytes)"; }

/// The first line of a LibTorch message, without its C++ context.
std::string first_line(const c10::Error& e) {
  std::string m = e.what_without_backtrace();
  const auto nl = m.find('\n');
  return nl == std::string::npos ? m : m.substr(0, nl);
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& g : opt.param_groups()) g.options().set_lr(lr);
}

struct EvalResult {
  double loss = 0;
  double accuracy = -1;
};

EvalResult evaluate_with_batch(models::Model& model, const data::Dataset& ds, const Config& cfg,
                               const torch::Device& device, int64_t epoch, int64_t bs) {
  torch::NoGradGuard no_grad;
  auto acc = torch::zeros({3}, torch::TensorOptions().dtype(torch::kDouble).device(device));  // loss, count, correct
  // eval_max_batches counts batches of train.eval_batch, whatever batch an out-of-memory
  // back-off runs with: the same samples are evaluated.
  const int64_t n = cfg.train.eval_max_batches > 0 ? std::min(ds.size(), cfg.train.eval_max_batches * cfg.train.eval_batch)
                                                   : ds.size();
  for (int64_t start = 0; start < n; start += bs) {
    std::vector<int64_t> idx;
    for (int64_t i = start; i < std::min(n, start + bs); ++i) idx.push_back(i);
    auto batch = ds.get(idx, epoch);
    auto input = batch.input.to(device), target = batch.target.to(device);
    torch::Tensor logits;
    {
      AutocastGuard ac(cfg.precision.mode, device.type());
      logits = model.forward(input);
    }
    auto flat = logits.reshape({-1, logits.size(-1)}).to(torch::kFloat);
    auto tgt = target.reshape({-1});
    auto valid = tgt != -100;
    auto losses = torch::nn::functional::cross_entropy(
        flat, tgt, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100).reduction(torch::kSum));
    acc[0] += losses.to(torch::kDouble);
    acc[1] += valid.sum().to(torch::kDouble);
    acc[2] += (flat.argmax(-1).eq(tgt) & valid).sum().to(torch::kDouble);
  }
  EvalResult r;
  const auto totals = acc.cpu();
  const double loss_sum = totals[0].item<double>(), count = totals[1].item<double>(),
               correct = totals[2].item<double>();
  r.loss = count > 0 ? loss_sum / count : 0;
  if (model.task() != models::Task::kCausalLM) r.accuracy = count > 0 ? correct / count : 0;
  return r;
}

/// Evaluation under a memory budget: an out-of-memory error halves the evaluation batch and
/// starts the evaluation over (its sums do not depend on the batch size). `bs` keeps the
/// batch that fitted for the next evaluation.
EvalResult evaluate(models::Model& model, const data::Dataset& ds, const Config& cfg, const torch::Device& device,
                    int64_t epoch, int64_t& bs) {
  model.eval();
  for (;;) {
    try {
      auto r = evaluate_with_batch(model, ds, cfg, device, epoch, bs);
      model.train();
      return r;
    } catch (const c10::OutOfMemoryError& e) {
      if (bs == 1) {
        model.train();
        throw std::runtime_error("evaluation: out of memory with evaluation batch 1 (" + first_line(e) +
                                 "); raise memory.budget");
      }
      log::warn("evaluation: out of memory with evaluation batch " + std::to_string(bs) + "; retrying with " +
                std::to_string(bs / 2));
      bs /= 2;
    }
  }
}

// An injected storage fault (ckpt_fail / ckpt_kill): writes `c` on this thread while no
// file may grow past half its tensor bytes, so the write fails (or the process dies) midway.
void write_under_storage_fault(CheckpointWriter& writer, const checkpoint_io::Checkpoint& c, bool kill) {
  int64_t bytes = 0;
  for (const auto* group : {&c.model, &c.optimizer})
    for (const auto& nt : *group) bytes += static_cast<int64_t>(nt.tensor.nbytes());
  writer.wait();  // the limit is process-wide: not on the write of an earlier checkpoint
  FileSizeFault limit(std::max<int64_t>(bytes / 2, 4096), kill);
  writer.write_now(c);
}

}  // namespace

TrainSummary run_training(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm,
                          const std::string& out_dir, const StartOptions& start) {
  const auto& t = cfg.train;
  const int world = comm.size(), rank = comm.rank();
  const auto ckpt_policy = models::CheckpointPolicy::parse(cfg.memory.activation_checkpoint);

  const torch::Device device = ctx.on_cuda() ? torch::Device(torch::kCUDA, ctx.device_index)
                                             : torch::Device(torch::kCPU);
  MemoryMeter meter(ctx.device_index);
  check_precision_supported(cfg.precision.mode, device);

  torch::manual_seed(static_cast<uint64_t>(cfg.data.seed));  // same initial weights on every rank
  auto data = data::make_datasets(cfg.data, cfg.model);
  auto model = models::build_model(cfg.model);
  model->to(device);
  model->train();
  models::apply_checkpoint_policy(*model, ckpt_policy);
  comm.set_step(0);
  comm.set_timeout(cfg.comm.startup_timeout_s);  // Note [Deadlines]
  // Every rank starts from rank 0's weights.
  for (auto& p : model->parameters()) {
    auto d = p.data();
    comm.broadcast(d, 0);
  }
  for (auto& b : model->buffers()) comm.broadcast(b, 0);
  auto optimizer = make_optimizer(t, *model);
  LossScaler scaler(cfg.precision, cfg.precision.mode == "fp16", device);
  // Note [Budget minimum]: what a step holds before its first activation: everything
  // allocated now (parameters, buffers, any tensor a data set holds), the communication
  // buffers (world > 1: one flat copy of the gradients), and the gradients and the optimizer
  // state the first step allocates. A budget below that cannot run a single sample; it is
  // refused here, before the run writes anything.
  int64_t param_bytes = 0;
  for (const auto& p : model->parameters()) param_bytes += static_cast<int64_t>(p.nbytes());
  const int64_t budget = parse_bytes(cfg.memory.budget);
  int64_t budget_minimum = 0;
  if (budget > 0) {
    const int64_t now = meter.stats().current_bytes;
    const int64_t comm_bytes = world > 1 ? param_bytes : 0;
    const int64_t opt_bytes = optimizer_state_bytes(t, param_bytes);
    budget_minimum = now + comm_bytes + param_bytes + opt_bytes;
    if (budget < budget_minimum)
      throw ConfigError("memory.budget = " + bytes_text(budget) + " is below the " + bytes_text(budget_minimum) +
                        " this run holds before any activation (allocated now: " + format_bytes(now) +
                        ", of it parameters " + format_bytes(param_bytes) + "; gradients " +
                        format_bytes(param_bytes) + "; optimizer state " + format_bytes(opt_bytes) +
                        (world > 1 ? "; communication buffers " + format_bytes(comm_bytes) : std::string()) +
                        "); set memory.budget / --memory-budget to at least " + std::to_string(budget_minimum) +
                        " bytes plus room for activations, or use a smaller model");
  }

  // What a back-off after an out-of-memory error changes (Note [Out-of-memory back-off]):
  // the checkpoints and the rest of the run use the new micro-batch.
  Config live = cfg;
  int64_t micro = t.micro_batch;
  int64_t accum = accumulation_steps(t, world);
  const int64_t n_train = data.train->size();
  const int64_t steps_per_epoch = data::global_batches_per_epoch(n_train, t.global_batch);
  if (steps_per_epoch == 0)
    throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) +
                      ": larger than the training set (" + std::to_string(n_train) + " samples)");
  const int64_t total_steps = t.steps > 0 ? t.steps : t.epochs * steps_per_epoch;

  // Where the run starts: a full resume, weights only, or step 0.
  const std::string ckpt_dir = checkpoint_dir(cfg, out_dir);
  int64_t start_step = 0;
  std::string resumed_from;
  if (!start.init_from.empty()) {
    auto c = checkpoint_io::read_checkpoint(start.init_from);
    const auto skipped = checkpoint_io::check_model(c, model_tensors(*model), start.init_from, start.init_skip_mismatched);
    std::map<std::string, torch::Tensor> saved;
    for (auto& nt : c.model) saved[nt.name] = nt.tensor;
    torch::NoGradGuard no_grad;
    int64_t loaded = 0;
    for (auto& nt : model_tensors(*model)) {
      if (saved.at(nt.name).sizes() != nt.tensor.sizes()) continue;
      nt.tensor.copy_(saved.at(nt.name));
      ++loaded;
    }
    std::string msg = "initialised " + std::to_string(loaded) + " tensors from " + start.init_from + " (step " +
                      std::to_string(c.step) + "); fresh optimizer, step 0";
    if (!skipped.empty()) {
      msg += "; skipped " + std::to_string(skipped.size()) + " with another shape:";
      for (const auto& n : skipped) msg += "\n  " + n;
    }
    log::info(msg);
  }
  if (!start.resume.empty()) {
    auto c = load_for_resume(start.resume, ckpt_dir, *model, comm, &resumed_from);
    if (c) {
      if (c->global_batch != t.global_batch)
        throw ConfigError("train.global_batch = " + std::to_string(t.global_batch) + ", but " + resumed_from +
                          " was trained with global batch " + std::to_string(c->global_batch) +
                          "; resuming needs the same global batch (--set train.global_batch=" +
                          std::to_string(c->global_batch) + ")");
      restore_state(*c, *model, *optimizer, scaler);
      start_step = c->step;
      std::string how = "resumed from " + resumed_from + " at step " + std::to_string(start_step);
      if (c->world_size != world || c->accumulation != accum)
        how += " (written by " + std::to_string(c->world_size) + " ranks x " + std::to_string(c->micro_batch) +
               " micro x " + std::to_string(c->accumulation) + " accumulation; now " + std::to_string(world) +
               " x " + std::to_string(t.micro_batch) + " x " + std::to_string(accum) + ", same global batch)";
      log::info(how);
    }
  }

  if (rank == 0) {
    files::make_dirs(out_dir);
    files::write_atomic(files::join(out_dir, "config.json"), config_to_json(cfg) + "\n");
  }
  // A resumed run appends to the metrics of the run it continues.
  MetricsWriter metrics(files::join(out_dir, "metrics.jsonl"), rank == 0, !resumed_from.empty());
  if (!start.plan_event.empty()) metrics.event("plan", start.plan_event);
  if (!resumed_from.empty())
    metrics.event("resume", {{"step", start_step}, {"path", resumed_from}, {"world_size", static_cast<int64_t>(world)}});
  double last_stall = 0;
  CheckpointWriter writer(ckpt_dir, cfg.checkpoint.keep_last, cfg.checkpoint.async,
                          [&](const std::string& path, const checkpoint_io::WriteStats& ws) {
                            metrics.event("checkpoint", {{"path", path},
                                                         {"bytes", ws.bytes},
                                                         {"seconds", ws.seconds},
                                                         {"stall_s", last_stall}});
                            log::info("checkpoint " + path + ": " + format_bytes(ws.bytes) + " in " +
                                      std::to_string(ws.seconds) + " s");
                          });
  install_preemption_handlers();
  const auto faults = FaultInjector::from_env();

  const int64_t n_params = models::count_parameters(*model);
  log::info("model " + cfg.model.kind + ": " + std::to_string(n_params) + " parameters; " +
            data.train->describe());
  log::info("device " + ctx.device_string() + ", " + std::to_string(ctx.threads) +
            " threads, world " + std::to_string(world) + ", precision " + cfg.precision.mode +
            "; global batch " + std::to_string(t.global_batch) + " = " + std::to_string(world) +
            " ranks x " + std::to_string(t.micro_batch) + " micro x " + std::to_string(accum) +
            " accumulation; activation checkpoint " + ckpt_policy.to_string() + "; " + std::to_string(total_steps) + " steps (" +
            std::to_string(steps_per_epoch) + " per epoch)");
  if (lr_scale(t) != 1.0)
    log::info("linear lr scaling: train.lr " + std::to_string(t.lr) + " x global batch " +
              std::to_string(t.global_batch) + " / train.lr_reference_batch " + std::to_string(t.lr_reference_batch) +
              " = " + std::to_string(t.lr * lr_scale(t)));

  Progress progress(cfg.log.progress, total_steps, cfg.log.every_steps, rank == 0);
  TrainSummary summary;
  const auto run_start = Clock::now();
  auto epoch_start = Clock::now();
  int64_t epoch_peak = 0, epoch_samples = 0;
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  const auto params = model->parameters();
  comm::GradientSync grad_sync(params, cfg.comm.first_bucket_mb, cfg.comm.bucket_mb, cfg.comm.overlap);
  if (world > 1) grad_sync.allocate_buffers();  // persistent, so part of every step's base memory
  if (budget > 0) {
    meter.set_budget(budget);
    log::info("memory budget " + format_bytes(budget) + " on " + meter.device_name() + " (minimum " +
              format_bytes(budget_minimum) + ")");
  }
  int64_t epoch_act_peak = 0;
  int64_t eval_batch = t.eval_batch;  // halved by an out-of-memory error in evaluation
  int64_t nonfinite_in_a_row = 0;
  // Note [Deadlines]: setup (broadcasts, resume), the first step (allocator warm-up, lazy
  // initialisation) and the step after an evaluation or a checkpoint (rank 0 may still be
  // writing) may be slow on one rank: those run under comm.startup_timeout_s; every other
  // step under comm.timeout_s, so a dead or stuck peer is noticed in seconds, not hours.
  bool generous_step = true;
  // Note [Taking turns] (turns.h): a benchmark harness may hand out the steps one at a time.
  StepTurns turns = StepTurns::from_env();
  bool turn_held = false;
  if (turns.enabled() && world > 1)
    throw ConfigError("LEANTRAIN_BENCH_TURNS is for one-process runs (this run has " + std::to_string(world) +
                      " ranks)");

  for (int64_t step = start_step; step < total_steps; ++step) {
    if (turn_held) turns.end_turn();  // the previous step's turn, after all its work
    turns.wait_turn();
    turn_held = true;
    const int64_t epoch = step / steps_per_epoch;
    const int64_t k = step % steps_per_epoch;
    if (epoch != perm_epoch) {
      perm = data::epoch_permutation(n_train, cfg.data.seed, epoch);
      perm_epoch = epoch;
    }
    comm.set_step(step + 1);
    comm.set_timeout(generous_step ? cfg.comm.startup_timeout_s : cfg.comm.timeout_s);
    generous_step = false;
    faults.at_step_start(step + 1, rank);
    const auto step_start = Clock::now();
    meter.reset_peak();
    const double lr = lr_at(t, step, total_steps);
    set_lr(*optimizer, lr);
    // Note [Gradients stay in the buckets]: under mpirun every .grad is, after the first
    // synchronisation, an alias of its slot in a persistent bucket buffer (Note [Gradients as
    // bucket views] in comm/src/grad_sync.cpp). Zeroing in place keeps it so: backward then
    // accumulates straight into the buckets, nothing is packed, and no second copy of the
    // gradients is allocated each step (DDP's gradient_as_bucket_view, kept across steps).
    // One rank has no buckets; there freeing the gradients keeps them out of the forward's peak.
    optimizer->zero_grad(/*set_to_none=*/world == 1);
    // Note [Memory breakdown]: what is allocated at the start of a step is parameters +
    // optimizer state + gradient buckets (holding the zeroed gradients under mpirun) + the rest
    // ("other": model buffers, the batch, and the background checkpoint writer's snapshot
    // while it writes); the step's peak above that is the gradients outside the buckets plus
    // the activations of one micro-batch. Optimizer state is summed over its tensors, so a
    // checkpoint snapshot is not counted as such.
    const int64_t step_base = meter.stats().current_bytes;
    const int64_t optimizer_bytes = optimizer_state_allocated_bytes(*optimizer);
    const int64_t other_bytes =
        std::max<int64_t>(0, step_base - param_bytes - optimizer_bytes - grad_sync.buffer_bytes());

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
    torch::Tensor loss_sum;
    int64_t tokens = 0, calls_in_microbatches = 0, grad_allreduce_calls = 0;
    double comm_time = 0, comm_exposed = 0, loss_val = 0, data_time = 0;
    bool stop = false;
    for (int attempt = 0;; ++attempt) {
      loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
      tokens = 0;
      const int64_t calls_at_step_start = comm.stats().allreduce_calls;
      bool last_backward_begun = false, oom = false;
      std::string oom_what;
      try {
        for (int64_t j = 0; j < accum; ++j) {
          auto idx = data::micro_batch_indices(perm, k, micro, accum, world, rank, j);
          const auto d0 = Clock::now();
          auto batch = data.train->get(idx, epoch);
          data_time += seconds_since(d0);
          tokens += batch.tokens;
          torch::manual_seed(micro_seed(cfg.data.seed, step, rank, j));
          torch::Tensor loss;
          {
            AutocastGuard ac(cfg.precision.mode, device.type());
            loss = model->forward_loss(batch.input.to(device), batch.target.to(device));
          }
          if (faults.fires(FaultKind::kNan, step + 1, rank)) loss = loss * std::numeric_limits<double>::quiet_NaN();
          // The buckets' all-reduces start inside the last micro-batch's backward (comm.overlap).
          if (world > 1 && j == accum - 1) {
            grad_sync.begin_last_backward(comm);
            last_backward_begun = true;
          }
          if (j == accum - 1 && attempt == 0 && faults.fires(FaultKind::kOom, step + 1, rank))
            TORCH_CHECK_WITH(OutOfMemoryError, false, "injected out of memory (LEANTRAIN_FAULT oom@", step + 1, ")");
          // Gradients average over the whole global batch: world x accumulation micro-batches.
          scaler.scale(loss / static_cast<double>(accum * world)).backward();
          loss_sum += loss.detach();  // stays on the device: one host sync per step, below
        }
      } catch (const c10::OutOfMemoryError& e) {
        oom = true;
        oom_what = first_line(e);
        // What the partial step accumulated. Dropped, not zeroed: a bucket's all-reduce may
        // still be reading its buffer.
        optimizer->zero_grad(/*set_to_none=*/true);
      }
      // Collectives issued while the micro-batches ran, besides the gradient buckets started in
      // the last backward (must be none: accumulation is local).
      calls_in_microbatches = comm.stats().allreduce_calls - calls_at_step_start -
                              (world > 1 && last_backward_begun ? grad_sync.last_times().started_in_backward : 0);
      if (world > 1) {
        // Once per optimizer step: one all-reduce per bucket; wait for them, sums into .grad.
        if (last_backward_begun)
          grad_sync.finish(comm);
        else
          grad_sync.all_reduce(comm);  // out of memory before the last backward began
        comm_time = grad_sync.last_times().comm_s;
        comm_exposed = grad_sync.last_times().exposed_s;
      }
      grad_allreduce_calls = comm.stats().allreduce_calls - calls_at_step_start - calls_in_microbatches;
      // The step's loss, the preemption flag and the out-of-memory flag travel together,
      // before the update: one small all-reduce, and every rank learns in the same step that
      // some rank was asked to stop, ran out of memory, or that the loss is not finite
      // (Note [Non-finite loss]).
      if (oom) loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
      auto flags = torch::tensor({preemption_requested() ? 1.0 : 0.0, oom ? 1.0 : 0.0}, loss_sum.options());
      auto reduced = torch::cat({(loss_sum / static_cast<double>(accum * world)).reshape({1}), flags});
      if (world > 1) comm.allreduce_sum(reduced);
      reduced = reduced.cpu();
      loss_val = reduced[0].item<double>();
      stop = reduced[1].item<double>() > 0;
      const int64_t ranks_oom = static_cast<int64_t>(std::lround(reduced[2].item<double>()));
      if (ranks_oom == 0) break;

      // The sums of a step that is redone; in place under mpirun (every collective has ended),
      // so the redo accumulates in the buckets (Note [Gradients stay in the buckets]).
      optimizer->zero_grad(/*set_to_none=*/world == 1);
      loss_sum = torch::Tensor();
      const std::string who = oom ? "out of memory" : "out of memory on " + std::to_string(ranks_oom) + " other rank(s)";
      const std::string where = "step " + std::to_string(step + 1) + ": " + who + " with micro-batch " +
                                std::to_string(micro) + (oom ? " (" + oom_what + ")" : std::string());
      if (micro == 1)
        throw TrainingStopped(where + "; micro-batch 1 does not fit: enable memory.activation_checkpoint "
                              "(selective, full), use precision.mode = \"bf16\", or raise memory.budget");
      // Halve (an odd micro-batch drops to its largest proper divisor, 1 for a prime).
      int64_t next = 1;
      for (int64_t d = micro / 2; d >= 1; --d)
        if (micro % d == 0) {
          next = d;
          break;
        }
      const int64_t next_accum = accum * (micro / next);
      log::warn(where + "; backing off to micro-batch " + std::to_string(next) + " x " +
                std::to_string(next_accum) + " accumulation (global batch " + std::to_string(t.global_batch) +
                " unchanged) and redoing the step");
      metrics.event("oom_backoff", {{"step", step + 1},
                                    {"old_micro_batch", micro},
                                    {"old_accumulation", accum},
                                    {"new_micro_batch", next},
                                    {"new_accumulation", next_accum},
                                    {"ranks", ranks_oom}});
      micro = next;
      accum = next_accum;
      live.train.micro_batch = micro;
      meter.reset_peak();  // the step's peak is the attempt that completes
    }
    int64_t grad_bytes = 0;  // gradients in the buckets are counted as buckets
    for (const auto& p : params)
      if (p.grad().defined() && !grad_sync.in_buckets(p.grad())) grad_bytes += static_cast<int64_t>(p.grad().nbytes());

    const double scale_used = scaler.scale_value();
    // Note [Non-finite loss]: fp16 leaves a NaN/inf to the loss scaler (its gradients are
    // non-finite too: the step is skipped and the scale backs off). In fp32/bf16 the update
    // is never applied: train.nonfinite = "stop" ends the run on every rank together, "skip"
    // drops the update (the step, its samples and the schedule still advance, as a skipped
    // fp16 step does) up to train.nonfinite_max_skips steps in a row.
    const bool nonfinite_loss = !scaler.enabled() && !std::isfinite(loss_val);
    if (nonfinite_loss) {
      ++nonfinite_in_a_row;
      if (t.nonfinite == "stop" || nonfinite_in_a_row > t.nonfinite_max_skips)
        throw TrainingStopped(
            "step " + std::to_string(step + 1) + ": the training loss is " + std::to_string(loss_val) +
            (t.nonfinite == "stop" ? std::string(" (train.nonfinite = \"stop\")")
                                   : " in " + std::to_string(nonfinite_in_a_row) +
                                         " steps in a row (train.nonfinite_max_skips = " +
                                         std::to_string(t.nonfinite_max_skips) + ")") +
            "; the update was not applied, the checkpoints in " + ckpt_dir +
            " are intact; lower train.lr, enable train.grad_clip, or set train.nonfinite = \"skip\"");
    } else {
      nonfinite_in_a_row = 0;
    }
    const bool stepped = !nonfinite_loss && apply_update(*optimizer, scaler, params, t.grad_clip, comm);
    if (!stepped) {
      if (nonfinite_loss) log::warn("step " + std::to_string(step + 1) + ": non-finite loss, update skipped");
      metrics.event("skipped_step", {{"step", step + 1},
                                     {"reason", std::string(nonfinite_loss ? "non-finite loss" : "non-finite gradient")},
                                     {"loss_scale", scale_used},
                                     {"new_loss_scale", scaler.scale_value()}});
    }
    const double step_time = seconds_since(step_start);
    const int64_t peak = meter.stats().peak_bytes;
    epoch_peak = std::max(epoch_peak, peak);
    summary.peak_mem_bytes = std::max(summary.peak_mem_bytes, peak);
    epoch_samples += t.global_batch;
    const double sps = static_cast<double>(t.global_batch) / step_time;
    MetricFields f = {{"step", step + 1},          {"epoch", epoch},
                      {"loss", loss_val},          {"lr", lr},
                      {"loss_scale", scale_used},         {"samples_per_s", sps},
                      {"step_time_s", step_time},  {"data_time_s", data_time},
                      {"comm_time_s", comm_time},
                      {"comm_exposed_s", comm_exposed},
                      {"comm_calls_in_microbatches", calls_in_microbatches},
                      {"grad_allreduce_calls", grad_allreduce_calls},
                      {"grad_buckets", static_cast<int64_t>(grad_sync.num_buckets())},
                      {"peak_mem_bytes", peak},
                      {"peak_rss_bytes", peak_rss_bytes()},
                      {"micro_batch", micro},
                      {"accumulation", accum},
                      {"mem_params_bytes", param_bytes},
                      {"mem_grads_bytes", grad_bytes},
                      {"mem_optimizer_bytes", optimizer_bytes},
                      {"mem_comm_buffers_bytes", grad_sync.buffer_bytes()},
                      {"mem_other_bytes", other_bytes},
                      {"mem_activations_bytes", std::max<int64_t>(0, peak - step_base - grad_bytes)}};
    epoch_act_peak = std::max(epoch_act_peak, std::max<int64_t>(0, peak - step_base - grad_bytes));
    if (tokens > 0) f.emplace_back("tokens_per_s", static_cast<double>(tokens * world) / step_time);
    metrics.event("step", f);
    progress.update(step + 1, loss_val, lr, sps);
    summary.final_loss = loss_val;
    summary.steps = step + 1;

    // Sync-step checkpoints: every checkpoint.every_steps, at the end (unless
    // checkpoint.at_end = false), and on preemption.
    const bool last = step + 1 == total_steps;
    const int64_t every = cfg.checkpoint.every_steps;
    const bool sync_step = stop || (last && cfg.checkpoint.at_end) || (every > 0 && (step + 1) % every == 0);
    if (sync_step) generous_step = true;
    if (rank == 0 && sync_step) {
      const auto c0 = Clock::now();
      const bool fail = faults.fires(FaultKind::kCheckpointFail, step + 1, rank);
      const bool crash = faults.fires(FaultKind::kCheckpointKill, step + 1, rank);
      // Note [Checkpoints under a CPU budget]: the background writer's copy of the state
      // (parameters + optimizer state) lives in the memory the budget limits on the CPU (on a
      // GPU it is host memory, outside the budget); with a CPU budget the write is synchronous
      // from the live tensors instead.
      const bool copy = writer.async() && !fail && !crash && !(budget > 0 && !ctx.on_cuda());
      auto c = capture_state(live, world, *model, *optimizer, scaler, step + 1, steps_per_epoch, copy);
      last_stall = seconds_since(c0);
      if (!copy && !fail && !crash && writer.async()) {
        writer.wait();
        writer.write_now(c);
      } else if (fail || crash) {
        write_under_storage_fault(writer, c, crash);
      } else {
        writer.submit(std::move(c));
      }
      if (writer.async()) last_stall = seconds_since(c0);
    }
    if (stop) {
      progress.interrupt();
      writer.wait();
      summary.preempted = true;
      log::info("preempted by signal " + std::to_string(preemption_signal()) + " after step " +
                std::to_string(step + 1) + ": checkpoint written; resume with --resume auto");
      break;
    }

    const bool epoch_end = (k == steps_per_epoch - 1) || (step + 1 == total_steps);
    if (epoch_end) {
      generous_step = true;  // ranks may finish the evaluation apart
      progress.interrupt();
      const double epoch_time = seconds_since(epoch_start);
      auto ev = evaluate(*model, *data.eval, cfg, device, epoch, eval_batch);
      summary.eval_loss = ev.loss;
      summary.eval_accuracy = ev.accuracy;
      summary.epochs = epoch + 1;
      MetricFields ef = {{"epoch", epoch},
                         {"step", step + 1},
                         {"eval_loss", ev.loss},
                         {"epoch_time_s", epoch_time},
                         {"samples_per_s", static_cast<double>(epoch_samples) / epoch_time},
                         {"peak_mem_bytes", epoch_peak},
                         {"peak_rss_bytes", peak_rss_bytes()},
                         {"mem_params_bytes", param_bytes},
                         {"mem_activations_bytes", epoch_act_peak}};
      std::ostringstream line;
      line.precision(4);
      line << std::fixed << "epoch " << epoch + 1 << ": eval loss " << ev.loss;
      if (ev.accuracy >= 0) {
        ef.emplace_back("eval_accuracy", ev.accuracy);
        line << ", accuracy " << 100.0 * ev.accuracy << "%";
      }
      if (model->task() != models::Task::kClassify) {
        ef.emplace_back("eval_perplexity", std::exp(ev.loss));
        line << ", perplexity " << std::exp(ev.loss);
      }
      line.precision(1);
      line << "; " << epoch_time << " s, " << static_cast<double>(epoch_samples) / epoch_time
           << " samples/s, peak memory " << format_bytes(epoch_peak) << " (parameters "
           << format_bytes(param_bytes) << ", activations " << format_bytes(epoch_act_peak) << ")";
      metrics.event("epoch", ef);
      log::info(line.str());
      epoch_start = Clock::now();
      epoch_peak = 0;
      epoch_act_peak = 0;
      epoch_samples = 0;
    }
  }
  if (turns.enabled()) {
    if (turn_held) turns.end_turn();
    turns.wait_turn();  // the exit turn: the teardown stays out of the other side's steps
  }
  writer.wait();
  summary.seconds = seconds_since(run_start);
  return summary;
}

}  // namespace lt::trainers
