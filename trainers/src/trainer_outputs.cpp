// What a Trainer does around its steps: evaluation (evaluate) and what a run writes and logs:
// config.json, metrics.jsonl (its start, step and epoch events), checkpoints (maybe_checkpoint)
// and their completion events, the run log and the progress line.
#include "leantrain/trainers/trainer.h"

#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "leantrain/optim/sharded_optimizer.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/trainers/faults.h"
#include "leantrain/trainers/schedule.h"
#include "trainer_internal.h"

namespace lt::trainers {

using trainer_detail::Clock;
using trainer_detail::first_line;
using trainer_detail::seconds_since;

namespace {

// The process's peak resident set so far (getrusage; Linux reports KiB). On the CPU this is
// the one memory figure a Python peer can report the same way (bench/peers/, docs/BENCH_PEERS.md).
int64_t peak_rss_bytes() {
  struct rusage ru {};
  if (::getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
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

// The sums of the eval samples [lo, hi) in batches of `bs`: loss, counted targets, correct.
torch::Tensor eval_sums(models::Model& model, const data::Dataset& ds, Precision precision,
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
    j["runtime"] = {{"device", device_.str()}, {"compute", parts_.model->compute_note(device_, compute_dtype(precision_))}};
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
  const std::string note = parts_.model->compute_note(device_, compute_dtype(precision_));
  if (!note.empty()) log::info(parts_.name + ": " + note);
  log::info("device " + ctx_.device_string() + ", " + std::to_string(ctx_.threads) + " threads, world " +
            std::to_string(world_) + " (" + comm_.backend() + "), precision " + cfg_.precision.mode + "; global batch " +
            std::to_string(t.global_batch) + " = " + std::to_string(world_) + " ranks x " +
            std::to_string(t.micro_batch) + " micro x " + std::to_string(accum_) +
            " accumulation; recompute " +
            models::RecomputePolicy::parse(cfg_.memory.recompute).to_string() + "; shard " +
            comm::to_string(shard_) +
            (shard_ == comm::ShardStage::kGradients ? " (" + cfg_.memory.grad_accum_dtype + " gradient sums)" : "") +
            ", optimizer state " + cfg_.memory.optimizer_state + "; " +
            std::to_string(total_steps_) + " steps (" + std::to_string(steps_per_epoch_) + " per epoch)");
  if (lr_scale(t) != 1.0)
    log::info("linear lr scaling: train.lr " + std::to_string(t.lr) + " x global batch " +
              std::to_string(t.global_batch) + " / train.lr_reference_batch " + std::to_string(t.lr_reference_batch) +
              " = " + std::to_string(t.lr * lr_scale(t)));
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
                    {"compute_s", r.compute_s},
                    {"timing", r.timing},
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
      acc = eval_sums(model, *parts_.eval, precision_, device_, epoch, lo, hi, eval_batch_);
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
  auto* sharded = dynamic_cast<optim::ShardedOptimizer*>(optimizer_.get());
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

}  // namespace lt::trainers
