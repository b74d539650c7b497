// Benchmark: FP32 HDF5 checkpoints of a real model with AdamW state (GPT-2 small by default).
//
//   build/bin/leantrain_bench_checkpoint [--model gpt2_small|small] [--config FILE.toml]
//                                        [--set key=value]... [--dir DIR] [--rounds N]
//                                        [--out FILE.md]
//
// (a) Write throughput: checkpoint_io::commit_checkpoint (the trainer's write: HDF5 + CRC-32,
//     temporary name, fsync, rename, fsync the directory, `latest`, keep_last) against a raw
//     baseline measured in the same run: fwrite of the same number of bytes from the same
//     tensors into the same directory, then fflush + fsync. The two alternate (A B B A ...)
//     after one untimed warm-up of each, so drift (page cache, other tenants of the disk)
//     falls on both; printed: bytes/s of each and the ratio ours / baseline.
// (b) Training stall per checkpoint with the background writer: the time the training loop
//     is blocked — capture_state(copy = true) plus CheckpointWriter::submit — against the
//     full write time the writer reports, with training steps running while it writes.
//
// --model gpt2_small loads configs/gpt2_small.toml (124M parameters; with AdamW's two
// moments a ~1.5 GB checkpoint; peak memory ~4.5 GB: parameters, gradients, AdamW state and
// the captured copy). --model small applies overrides for a tiny GPT (a smoke run of seconds).
// The training steps use a short sequence (--tokens, default 16): they exist to create the
// optimizer state and to keep the loop busy while the writer runs, not to measure training.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/data/dataset.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/checkpointing.h"
#include "leantrain/trainers/precision.h"
#include "leantrain/trainers/trainer.h"

#ifndef LEANTRAIN_SOURCE_DIR
#define LEANTRAIN_SOURCE_DIR "."
#endif

namespace {

// Windows of `tokens` ids (fewer than the model's context): the bench's training steps only
// create the optimizer state and keep the loop busy while the writer runs.
class ShortWindows final : public lt::data::Dataset {
 public:
  ShortWindows(int64_t vocab, int64_t tokens) : vocab_(vocab), tokens_(tokens) {}
  int64_t size() const override { return 4096; }
  lt::data::Batch get(const std::vector<int64_t>& indices, int64_t) const override {
    auto ids = torch::tensor(indices, torch::kLong).unsqueeze(1) * 7 + torch::arange(tokens_ + 1, torch::kLong);
    ids = ids.remainder(vocab_);
    using torch::indexing::Slice;
    return {ids.index({Slice(), Slice(0, tokens_)}), ids.index({Slice(), Slice(1, tokens_ + 1)}),
            static_cast<int64_t>(indices.size()) * tokens_};
  }
  std::string describe() const override { return "short windows of " + std::to_string(tokens_) + " tokens"; }

 private:
  int64_t vocab_, tokens_;
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Options {
  std::string model = "gpt2_small";
  std::string config = std::string(LEANTRAIN_SOURCE_DIR) + "/configs/gpt2_small.toml";
  std::vector<std::string> sets;
  std::string dir;
  std::string out;
  int rounds = 3;
  int64_t tokens = 16;
};

double mib_per_s(int64_t bytes, double s) { return static_cast<double>(bytes) / s / (1024.0 * 1024.0); }

int64_t peak_rss_bytes() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<int64_t>(ru.ru_maxrss) * 1024;
}

/// The raw baseline: `bytes` bytes taken from the checkpoint's tensors in order (repeating
/// them if the file is larger than their payload), fwrite'n to `path`, then fflush + fsync.
double raw_write(const std::string& path, const lt::checkpoint_io::Checkpoint& c, int64_t bytes) {
  const auto t0 = Clock::now();
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (fp == nullptr) throw std::runtime_error(path + ": cannot create the baseline file");
  int64_t left = bytes;
  while (left > 0) {
    for (const auto* group : {&c.model, &c.optimizer})
      for (const auto& nt : *group) {
        if (left <= 0) break;
        const auto n = std::min<int64_t>(left, static_cast<int64_t>(nt.tensor.nbytes()));
        if (n > 0 && std::fwrite(nt.tensor.data_ptr(), 1, static_cast<size_t>(n), fp) != static_cast<size_t>(n)) {
          std::fclose(fp);
          throw std::runtime_error(path + ": baseline fwrite failed (disk full?)");
        }
        left -= n;
      }
  }
  if (std::fflush(fp) != 0 || ::fsync(::fileno(fp)) != 0) {
    std::fclose(fp);
    throw std::runtime_error(path + ": baseline fflush/fsync failed");
  }
  std::fclose(fp);
  const double s = seconds_since(t0);
  ::unlink(path.c_str());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::cerr << k << " needs a value\n";
      return 2;
    }
    const std::string v = argv[i + 1];
    if (k == "--model") o.model = v;
    else if (k == "--config") o.config = v;
    else if (k == "--set") o.sets.push_back(v);
    else if (k == "--dir") o.dir = v;
    else if (k == "--out") o.out = v;
    else if (k == "--rounds") o.rounds = std::stoi(v);
    else if (k == "--tokens") o.tokens = std::stoll(v);
    else {
      std::cerr << "unknown option " << k << " (see the comment at the top of bench/checkpoint_bench.cpp)\n";
      return 2;
    }
  }
  if (o.model != "gpt2_small" && o.model != "small") {
    std::cerr << "--model " << o.model << ": allowed: gpt2_small | small\n";
    return 2;
  }
  if (o.rounds < 1) {
    std::cerr << "--rounds must be at least 1\n";
    return 2;
  }
  std::vector<std::string> sets;
  if (o.model == "small")
    sets = {"model.vocab_size=1024", "model.seq_len=64", "model.n_layer=2", "model.d_model=128", "model.n_head=4"};
  sets.insert(sets.end(), o.sets.begin(), o.sets.end());
  // A scratch folder of our own inside --dir (default /tmp), removed at the end.
  const std::string scratch =
      lt::files::join(o.dir.empty() ? "/tmp" : o.dir, "leantrain_bench_checkpoint." + std::to_string(::getpid()));

  try {
    // As the trainer does (make_runtime_context): freed blocks stay mapped, so the capture's
    // clones do not fault in fresh pages at every checkpoint.
    lt::keep_freed_memory_for_reuse();
    torch::set_num_threads(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
    lt::Config cfg = lt::load_config(o.config, sets);
    cfg.precision.mode = "fp32";
    cfg.train.optimizer = "adamw";
    lt::validate(cfg, 1);
    lt::files::make_dirs(scratch);

    // The trainer itself (its AdamW, its step) on short token windows.
    cfg.data.seed = 0;
    cfg.train.global_batch = cfg.train.micro_batch = 1;
    cfg.train.steps = int64_t{1} << 40;
    cfg.checkpoint.dir.clear();
    lt::RuntimeContext ctx;
    ctx.threads = torch::get_num_threads();
    lt::comm::LocalCommunicator local;
    torch::manual_seed(0);
    const lt::InputContract contract = lt::models::model_contract(cfg.model);
    const int64_t T = std::min(o.tokens, contract.seq_len);
    lt::trainers::Trainer trainer(cfg,
                                  {lt::models::build_model(cfg.model),
                                   std::make_shared<ShortWindows>(contract.vocab_size, T), nullptr, "gpt"},
                                  ctx, local);
    auto& model = trainer.model();
    auto& optimizer = trainer.optimizer();
    lt::trainers::LossScaler scaler(cfg.precision, false, torch::kCPU);  // fp32: its state only
    int64_t steps_run = 0;
    auto train_step = [&] { trainer.train_step(steps_run++); };
    const auto t_step = Clock::now();
    train_step();  // creates the AdamW state
    const double step_s = seconds_since(t_step);
    int64_t step = 1;

    const auto n_params = lt::models::count_parameters(model);
    std::ostringstream md;
    char line[512];
    std::snprintf(line, sizeof line,
                  "model %s: %lld parameters (configs %s%s), AdamW, fp32; checkpoint dir %s; %d round(s); one "
                  "training step (1 x %lld tokens) %.2f s\n",
                  o.model.c_str(), static_cast<long long>(n_params), o.config.c_str(),
                  o.model == "small" ? " + tiny overrides" : "", scratch.c_str(), o.rounds,
                  static_cast<long long>(T), step_s);
    md << line << "\n";

    // ---- (a) write throughput vs fwrite + fsync --------------------------------------------
    auto c = lt::trainers::capture_state(cfg, 1, model, optimizer, scaler, step, 1000, false);
    int64_t payload = 0;
    for (const auto* group : {&c.model, &c.optimizer})
      for (const auto& nt : *group) payload += static_cast<int64_t>(nt.tensor.nbytes());
    const std::string raw_path = lt::files::join(scratch, "baseline.bin");
    int64_t ckpt_step = 1000000;  // distinct names; keep_last = 1 removes the previous one
    const auto warm = lt::checkpoint_io::commit_checkpoint(scratch, c, 1);
    c.step = ++ckpt_step;
    const int64_t bytes = warm.bytes;
    raw_write(raw_path, c, bytes);  // warm-up of the baseline
    std::vector<double> ours, raw;
    for (int r = 0; r < o.rounds; ++r) {
      for (int k = 0; k < 2; ++k) {
        const bool ours_now = (r % 2 == 0) == (k == 1);  // B A, A B, B A, ...: baseline first in round 0
        if (ours_now) {
          c.step = ++ckpt_step;
          const auto s = lt::checkpoint_io::commit_checkpoint(scratch, c, 1);
          if (s.bytes != bytes) std::cerr << "note: checkpoint size changed: " << s.bytes << " vs " << bytes << "\n";
          ours.push_back(s.seconds);
        } else {
          raw.push_back(raw_write(raw_path, c, bytes));
        }
      }
      std::fprintf(stderr, "  round %d: baseline %.3f s (%.0f MiB/s), checkpoint %.3f s (%.0f MiB/s)\n", r + 1,
                   raw.back(), mib_per_s(bytes, raw.back()), ours.back(), mib_per_s(bytes, ours.back()));
    }
    double sum_ours = 0, sum_raw = 0;
    for (double s : ours) sum_ours += s;
    for (double s : raw) sum_raw += s;
    md << "| write of " << lt::format_bytes(bytes) << " (" << bytes << " B; tensor payload " << payload
       << " B) | mean s | bytes/s | MiB/s | rounds (s) |\n|---|---|---|---|---|\n";
    auto row = [&](const char* name, const std::vector<double>& v, double sum) {
      std::ostringstream each;
      for (size_t i = 0; i < v.size(); ++i) each << (i ? ", " : "") << std::fixed << std::setprecision(3) << v[i];
      const double mean = sum / static_cast<double>(v.size());
      std::snprintf(line, sizeof line, "| %s | %.3f | %.3e | %.0f | %s |\n", name, mean,
                    static_cast<double>(bytes) / mean, mib_per_s(bytes, mean), each.str().c_str());
      md << line;
    };
    row("baseline: fwrite + fflush + fsync", raw, sum_raw);
    row("commit_checkpoint (HDF5 + CRC-32 + atomic commit)", ours, sum_ours);
    std::snprintf(line, sizeof line, "\nthroughput ratio checkpoint / baseline: %.2fx (target >= 0.80x)\n\n",
                  sum_raw / sum_ours);
    md << line;
    c = lt::checkpoint_io::Checkpoint{};  // drop the aliases before the stall rounds

    // ---- (b) training stall with the background writer ------------------------------------
    std::mutex mu;
    std::vector<lt::checkpoint_io::WriteStats> writes;
    lt::trainers::CheckpointWriter writer(scratch, 1, true,
                                          [&](const std::string&, const lt::checkpoint_io::WriteStats& s, double) {
                                            std::lock_guard<std::mutex> lock(mu);
                                            writes.push_back(s);
                                          });
    std::vector<double> capture_s, submit_s, steps_during;
    std::vector<double> wait_s;
    for (int r = 0; r < o.rounds; ++r) {
      train_step();
      ++step;
      const auto t0 = Clock::now();
      auto snap = lt::trainers::capture_state(cfg, 1, model, optimizer, scaler, step, 1000, true);
      capture_s.push_back(seconds_since(t0));
      const auto t1 = Clock::now();
      writer.submit(std::move(snap));
      submit_s.push_back(seconds_since(t1));
      // The loop goes on training while the writer works; count the steps that fit. A failed
      // write never reports: past a generous deadline, wait() below rethrows its error.
      int n = 0;
      const double deadline = 60 + 20 * sum_ours / static_cast<double>(o.rounds);
      for (const auto t_write = Clock::now(); seconds_since(t_write) < deadline;) {
        {
          std::lock_guard<std::mutex> lock(mu);
          if (writes.size() == static_cast<size_t>(r + 1)) break;
        }
        train_step();
        ++step;
        ++n;
      }
      const auto t2 = Clock::now();
      writer.wait();
      wait_s.push_back(seconds_since(t2));
      if (writes.size() != static_cast<size_t>(r + 1)) throw std::runtime_error("the background write did not finish");
      steps_during.push_back(n);
      std::fprintf(stderr, "  stall round %d: capture %.3f s + submit %.4f s; write %.3f s; %d steps trained meanwhile\n",
                   r + 1, capture_s.back(), submit_s.back(), writes.back().seconds, n);
    }
    md << "| checkpoint of " << lt::format_bytes(writes.front().bytes)
       << " | stall = capture(copy) + submit, s | of which submit, s | full write, s | stall / write | steps "
          "trained during the write |\n|---|---|---|---|---|---|\n";
    for (int r = 0; r < o.rounds; ++r) {
      const double stall = capture_s[r] + submit_s[r];
      std::snprintf(line, sizeof line, "| round %d | %.3f | %.4f | %.3f | %.2f | %.0f |\n", r + 1, stall, submit_s[r],
                    writes[r].seconds, stall / writes[r].seconds, steps_during[r]);
      md << line;
    }
    std::snprintf(line, sizeof line, "\npeak RSS %s\n", lt::format_bytes(peak_rss_bytes()).c_str());
    md << line;
    std::cout << md.str();
    if (!o.out.empty()) std::ofstream(o.out) << md.str();
    lt::files::remove_tree(scratch);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "leantrain_bench_checkpoint: " << e.what() << "\n";
    lt::files::remove_tree(scratch);
    return 1;
  }
}
