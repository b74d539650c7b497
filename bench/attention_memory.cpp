// Benchmark: the activation memory SDPA attention saves (model.attention = sdpa vs plain), and
// a budget under which GPT trains with SDPA and `full` recompute but not with plain attention.
// Ratios are measured in the same run; nothing is asserted about time.
//
//   build/bin/leantrain_bench_attention [--layers 12] [--seq 1024] [--micro 4] [--precision bf16]
//                                       [--dropout 0] [--budget auto|BYTES] [--no-full] [--out FILE.md]
//
// GPT-2 small's shape (d 768, 12 heads, vocab 50257) with --layers blocks, one training step
// each (Trainer::train_step, the step `leantrain train` runs; SGD without momentum or decay,
// so the update allocates nothing): activations = the step's peak above its start, less the
// gradients (the trainer's mem_activations_bytes); peak = everything the tracking allocator
// counts (parameters, gradients, the batch, activations). Then the budget (auto: halfway
// between SDPA+full's peak and plain+full's) is set as a hard limit and SDPA+full, plain+full
// and plain+none each run one step under it: "fits" or "out of memory" (--no-full: none only).
// Dropout defaults to 0, as GPT pretraining recipes (nanoGPT) use it: on the CPU LibTorch's
// flash kernel takes no dropout, and with attention dropout SDPA runs its math fallback, which
// keeps the probabilities as plain does (docs/PRECISION_AND_MEMORY.md).
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/trainer.h"

namespace {

struct Options {
  int layers = 12, seq = 1024, micro = 4;
  double dropout = 0.0;
  std::string precision = "bf16", budget = "auto", out;
  bool full = true;
};

struct Row {
  std::string attention, policy;
  int64_t act_bytes = 0, peak_bytes = 0;
  double step_s = 0;
  bool oom = false;
};

// One training step of GPT with this attention core and recompute policy; budget 0 = none.
Row measure(const Options& o, const std::string& attention, const std::string& policy, int64_t budget) {
  lt::models::ModelConfig g = lt_bench::gpt2_shape(o.layers, o.seq, o.dropout);
  g.attention = attention;
  lt::Config cfg;
  cfg.model = lt::models::builtin_model_section(g);
  cfg.data.kind = "synthetic";
  cfg.data.seed = 0;
  cfg.data.options.set("synthetic_samples", int64_t{std::max(16, o.micro)});
  cfg.train.global_batch = cfg.train.micro_batch = o.micro;
  cfg.train.steps = 1;
  cfg.train.optimizer = "sgd";
  cfg.train.momentum = 0;
  cfg.train.weight_decay = 0;
  cfg.train.grad_clip = 0;
  cfg.precision.mode = o.precision;
  cfg.memory.recompute = policy;
  cfg.memory.budget = std::to_string(budget);
  lt::RuntimeContext ctx;
  ctx.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  lt::comm::LocalCommunicator comm;
  lt::trainers::TrainerOptions topt;
  topt.oom_backoff = false;  // an out-of-memory error is the answer, not something to recover from
  Row r{attention, policy};
  {
    lt::trainers::Trainer trainer(cfg, lt::trainers::make_components(cfg), ctx, comm, topt);
    const auto t0 = std::chrono::steady_clock::now();
    try {
      const auto step = trainer.train_step(0);
      r.act_bytes = step.activation_bytes();
      r.peak_bytes = step.peak_bytes;
    } catch (const c10::OutOfMemoryError&) {
      r.oom = true;
    }
    r.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  lt::MemoryMeter(-1).set_budget(0);
  std::fprintf(stderr, "  %s %s%s: %s\n", attention.c_str(), policy.c_str(),
               budget > 0 ? (" under " + lt::format_bytes(budget)).c_str() : "",
               r.oom ? "out of memory"
                     : ("activations " + lt::format_bytes(r.act_bytes) + ", peak " + lt::format_bytes(r.peak_bytes) +
                        ", step " + std::to_string(r.step_s) + " s")
                           .c_str());
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const int code = lt_bench::parse_args(
      argc, argv,
      "usage: leantrain_bench_attention [--layers 12] [--seq 1024] [--micro 4] [--precision bf16|fp32]\n"
      "       [--dropout 0] [--budget auto|BYTES] [--no-full] [--out FILE.md]\n",
      {"--no-full"}, [&o](const std::string& k, const std::string& v) {
        if (k == "--no-full") o.full = false;
        else if (k == "--layers") o.layers = std::stoi(v);
        else if (k == "--seq") o.seq = std::stoi(v);
        else if (k == "--micro") o.micro = std::stoi(v);
        else if (k == "--dropout") o.dropout = std::stod(v);
        else if (k == "--precision") o.precision = v;
        else if (k == "--budget") o.budget = v;
        else if (k == "--out") o.out = v;
        else return false;
        return true;
      });
  if (code >= 0) return code;
  lt_bench::measure_cpu_memory();
  std::fprintf(stderr, "GPT-%dL d768, seq %d, micro-batch %d, %s, dropout %g\n", o.layers, o.seq, o.micro,
               o.precision.c_str(), o.dropout);
  const Row sdpa_none = measure(o, "sdpa", "none", 0), plain_none = measure(o, "plain", "none", 0);
  std::vector<const Row*> rows = {&sdpa_none, &plain_none};
  Row sdpa_full, plain_full, b_sdpa_full, b_plain_full, b_plain_none;
  int64_t budget = 0;
  if (o.full) {
    sdpa_full = measure(o, "sdpa", "full", 0);
    plain_full = measure(o, "plain", "full", 0);
    rows.push_back(&sdpa_full);
    rows.push_back(&plain_full);
    budget = o.budget == "auto" ? (sdpa_full.peak_bytes + plain_full.peak_bytes) / 2 : std::stoll(o.budget);
    b_sdpa_full = measure(o, "sdpa", "full", budget);
    b_plain_full = measure(o, "plain", "full", budget);
    b_plain_none = measure(o, "plain", "none", budget);
  }

  std::ostringstream md;
  char line[512];
  std::snprintf(line, sizeof(line), "GPT-%dL d768, seq %d, micro-batch %d, %s, dropout %g, one step each\n\n",
                o.layers, o.seq, o.micro, o.precision.c_str(), o.dropout);
  md << line << "| attention | recompute | activations | vs plain (same recompute) | peak |\n"
     << "|---|---|---|---|---|\n";
  for (const auto* pair : rows) {
    const Row& base = pair->policy == "none" ? plain_none : plain_full;
    std::snprintf(line, sizeof(line), "| %s | %s | %s | %.3fx | %s |\n", pair->attention.c_str(),
                  pair->policy.c_str(), lt::format_bytes(pair->act_bytes).c_str(),
                  static_cast<double>(pair->act_bytes) / static_cast<double>(base.act_bytes),
                  lt::format_bytes(pair->peak_bytes).c_str());
    md << line;
  }
  if (!o.full) {
    std::cout << md.str();
    if (!o.out.empty()) std::ofstream(o.out) << md.str();
    return 0;
  }
  std::snprintf(line, sizeof(line), "\nUnder a budget of %s (%lld bytes%s):\n\n", lt::format_bytes(budget).c_str(),
                static_cast<long long>(budget), o.budget == "auto" ? ", halfway between the two full peaks" : "");
  md << line << "| attention | recompute | under the budget |\n|---|---|---|\n";
  for (const auto* r : {&b_sdpa_full, &b_plain_full, &b_plain_none}) {
    std::snprintf(line, sizeof(line), "| %s | %s | %s |\n", r->attention.c_str(), r->policy.c_str(),
                  r->oom ? "out of memory" : ("fits, peak " + lt::format_bytes(r->peak_bytes)).c_str());
    md << line;
  }
  std::cout << md.str();
  if (!o.out.empty()) std::ofstream(o.out) << md.str();
  return 0;
}
