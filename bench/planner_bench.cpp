// Benchmark: the memory planner (issue 7, docs/BENCH_PLANNER.md). For each model and CPU (or
// GPU) budget: the planned configuration's measured peak (<= budget) and samples/s, against
// the best configuration of an exhaustive sweep and against the seed's manual recipe (bf16,
// then accumulation until it fits, then full recompute), and the planning time as a share
// of a 1,000-step run.
//
//   build/bin/leantrain_bench_planner [--models gpt12,gpt24,resnet50] [--budgets 1GiB,2GiB,4GiB]
//       [--skip gpt24@4GiB] [--steps 1] [--warmup 2] [--seq 512] [--image 224]
//       [--gpt-batch 2] [--resnet-batch 16] [--gpt-sweep-precisions fp32,bf16]
//       [--resnet-sweep-precisions fp32,bf16] [--margin 0.1] [--out FILE.md] [--work DIR]
//
// The GPT sweep covers bf16 on a GPU or a CPU with bf16 instructions (AVX-512 BF16 or AMX),
// fp32 only elsewhere (cpu_info()); --gpt-sweep-precisions overrides.
//
// Every measurement is a real training run (trainers::run_training, the path of `leantrain
// train`): `--warmup` steps, then `--steps` timed optimizer steps of the global batch; its
// peak is the largest step peak of the run (warm-up included), its samples/s the global batch
// over the mean timed step time.
//
// Note [Sweep once per model]: the sweep's candidates are the planner's (precision x policy x
// the power-of-two micro-batches dividing the global batch). Each is run once per model under
// the largest budget as a hard limit; for a smaller budget the best is the fastest candidate
// whose measured peak is <= that budget (the peak of a run does not depend on the budget
// above it), and that best is run again under the budget to verify it. Within a (precision,
// policy) a micro-batch is not run once a smaller one did not fit: peaks grow with the
// micro-batch. A candidate that runs out of memory (the trainer backs off: an `oom_backoff`
// event, or micro-batch 1 stops the run) does not fit.
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/memory_meter.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"
#include "leantrain/trainers/planner.h"
#include "leantrain/trainers/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::vector<std::string> models = {"gpt12", "gpt24", "resnet50"};
  std::vector<std::string> budgets = {"1GiB", "2GiB", "4GiB"};
  std::vector<std::string> skip = {"gpt24@4GiB"};
  // Two warm-up steps: the second step is the first to reach the steady peak (the AdamW
  // moments appear in step 1's update), and on a VM its fresh pages fault in slowly: GPT-12L
  // bf16 steps 1-4 took 4.0 / 4.0 / 2.4 / 2.5 s, so a run timing step 2 ranks candidates by
  // page faults (it put 1x2 ahead of 2x1, which is 1.08x faster from step 3 on).
  int steps = 1, warmup = 2;
  int64_t seq = 512, image = 224, gpt_batch = 2, resnet_batch = 16;
  std::vector<std::string> gpt_precisions, resnet_precisions = {"fp32", "bf16"};
  double margin = 0.10;
  std::string out, work;
};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream ss(s);
  for (std::string p; std::getline(ss, p, ',');)
    if (!p.empty() && p != "none") v.push_back(p);
  return v;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string gib(int64_t bytes) { return bytes < 0 ? "-" : fmt("%.2f GiB", static_cast<double>(bytes) / (1 << 30)); }

// The CPU's model name and its bf16 instructions (AVX-512 BF16, AMX): without them bf16
// matmuls take a reference path 10-20x slower than fp32 (Note [Slow candidates]), and a
// GPT-sized bf16 sweep would take hours; with them bf16 is the fast precision.
struct CpuInfo {
  std::string model = "unknown CPU";
  std::vector<std::string> bf16;
};

// Read once: /proc/cpuinfo does not change during a run.
const CpuInfo& cpu_info() {
  static const CpuInfo info = [] {
    CpuInfo c;
    std::ifstream in("/proc/cpuinfo");
    bool flags_seen = false;
    for (std::string line; std::getline(in, line);) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      std::string key = line.substr(0, colon);
      key.erase(key.find_last_not_of(" \t") + 1);
      const std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
      if (key == "model name" && c.model == "unknown CPU") c.model = value;
      if (key == "flags" && !flags_seen) {
        flags_seen = true;
        std::istringstream f(value);
        for (std::string flag; f >> flag;)
          if (flag == "avx512_bf16" || flag == "amx_bf16") c.bf16.push_back(flag);
      }
    }
    return c;
  }();
  return info;
}

std::string cpu_text(const CpuInfo& c) {
  std::string b;
  for (const auto& f : c.bf16) b += (b.empty() ? "" : " + ") + f;
  return c.model + ", " + std::to_string(sysconf(_SC_NPROCESSORS_ONLN)) + " cores, bf16 instructions: " +
         (b.empty() ? "none" : b);
}

struct ModelSpec {
  std::string name, toml;
  int64_t global_batch = 0;
  std::vector<std::string> sweep_precisions;
};

ModelSpec model_spec(const std::string& name, const Options& o, bool cuda) {
  ModelSpec m;
  std::ostringstream t;
  if (name == "gpt12" || name == "gpt24") {
    const int layers = name == "gpt12" ? 12 : 24;
    m.name = "GPT-" + std::to_string(layers) + "L d768 seq " + std::to_string(o.seq);
    m.global_batch = o.gpt_batch;
    m.sweep_precisions = !o.gpt_precisions.empty() ? o.gpt_precisions
                                                   : (cuda || !cpu_info().bf16.empty()
                                                          ? std::vector<std::string>{"fp32", "bf16"}
                                                          : std::vector<std::string>{"fp32"});
    t << "[model]\nkind = \"gpt\"\nvocab_size = 50257\nseq_len = " << o.seq << "\nn_layer = " << layers
      << "\nn_head = 12\nd_model = 768\ndropout = 0.1\n";
  } else if (name == "resnet50") {
    m.name = "ResNet-50 " + std::to_string(o.image) + "px";
    m.global_batch = o.resnet_batch;
    m.sweep_precisions = o.resnet_precisions;
    t << "[model]\nkind = \"resnet\"\ndepth = 50\nwidth = 64\nstem = \"imagenet\"\nin_channels = 3\nimage_size = "
      << o.image << "\nnum_classes = 1000\n";
  } else {
    throw lt::ConfigError("--models: \"" + name + "\" is not one of gpt12 | gpt24 | resnet50");
  }
  // AdamW for all three: the fixed part is parameters + gradients + two moments (16 bytes a
  // parameter), the setting of the issue's infeasible cells.
  t << "[data]\nkind = \"synthetic\"\nsynthetic_samples = " << m.global_batch * (o.warmup + o.steps + 1) + 64
    << "\n[train]\nglobal_batch = " << m.global_batch << "\nmicro_batch = 1\noptimizer = \"adamw\"\nlr = 1e-4\n"
    << "warmup_steps = 0\neval_batch = 1\neval_max_batches = 1\n[log]\nprogress = \"none\"\nevery_steps = 1000\n"
    << "[checkpoint]\nkeep_last = 1\n";
  m.toml = t.str();
  return m;
}

struct Candidate {
  std::string precision, policy;
  int64_t micro = 0;
  bool operator<(const Candidate& c) const {
    return std::tie(precision, policy, micro) < std::tie(c.precision, c.policy, c.micro);
  }
  std::string text(int64_t global_batch) const {
    return precision + "/" + policy + "/" + std::to_string(micro) + "x" + std::to_string(global_batch / micro);
  }
};

struct Measured {
  bool fits = false;      // ran to the end without running out of memory
  std::string why;        // when it did not
  int64_t peak = -1;      // bytes, the largest step peak
  double step_s = -1;     // mean timed step
  double sps = -1;
};

class Bench {
 public:
  explicit Bench(const Options& o) : o_(o) {}

  // One training run of `c` under `budget` (0: none).
  Measured measure(const ModelSpec& spec, const Candidate& c, int64_t budget) {
    const auto key = std::make_tuple(spec.name, c, budget);
    if (auto it = cache_.find(key); it != cache_.end()) return it->second;
    const std::string dir = lt::files::join(o_.work, "run" + std::to_string(runs_++));
    const std::vector<std::string> sets = {
        "precision.mode=" + c.precision, "memory.recompute=" + c.policy,
        "train.micro_batch=" + std::to_string(c.micro), "train.steps=" + std::to_string(o_.warmup + o_.steps),
        "memory.budget=" + std::to_string(budget)};
    Measured m;
    const auto t0 = Clock::now();
    try {
      lt::Config cfg = lt::parse_config(spec.toml, spec.name, sets);
      lt::validate(cfg, 1);
      const auto ctx = lt::make_runtime_context(cfg, lt::detect_world());
      auto comm = lt::comm::make_communicator(cfg.comm, ctx);
      if (lt::trainers::run_training(cfg, ctx, *comm, dir).preempted)
        throw std::runtime_error("stopped by SIGTERM/SIGUSR1 (a timeout?): the measurements are incomplete");
      std::ifstream in(lt::files::join(dir, "metrics.jsonl"));
      double timed = 0;
      int n = 0;
      bool backoff = false;
      for (std::string line; std::getline(in, line);) {
        const auto e = nlohmann::json::parse(line);
        if (e["event"] == "oom_backoff") backoff = true;
        if (e["event"] != "step") continue;
        m.peak = std::max(m.peak, e["peak_mem_bytes"].get<int64_t>());
        if (e["step"].get<int>() > o_.warmup) timed += e["step_time_s"].get<double>(), ++n;
      }
      if (backoff) {
        m.why = "OOM (backed off)";
      } else if (n == 0) {
        m.why = "no timed step";
      } else {
        m.fits = true;
        m.step_s = timed / n;
        m.sps = static_cast<double>(spec.global_batch) / m.step_s;
      }
    } catch (const lt::TrainingStopped&) {
      m.why = "OOM at micro-batch 1";
    } catch (const c10::OutOfMemoryError&) {
      m.why = "OOM";
    } catch (const lt::ConfigError& e) {
      m.why = std::string("refused: ") + e.what();
    } catch (const c10::Error& e) {
      m.why = std::string("error: ") + e.what_without_backtrace();
    }
    lt::files::remove_tree(dir);
    std::fprintf(stderr, "[bench] %s %s budget %s: %s, peak %s, %.3f samples/s (%.0f s)\n", spec.name.c_str(),
                 c.text(spec.global_batch).c_str(), budget > 0 ? gib(budget).c_str() : "none",
                 m.fits ? "ok" : m.why.substr(0, 60).c_str(), gib(m.peak).c_str(), m.sps,
                 std::chrono::duration<double>(Clock::now() - t0).count());
    cache_[key] = m;
    return m;
  }

  void run_model(const std::string& name) {
    const auto ctx0 = lt::make_runtime_context(lt::parse_config(model_spec(name, o_, false).toml, name), lt::detect_world());
    const ModelSpec spec = model_spec(name, o_, ctx0.on_cuda());
    std::vector<int64_t> budgets;
    for (const auto& b : o_.budgets) {
      const std::string label = name + "@" + b;
      if (std::find(o_.skip.begin(), o_.skip.end(), label) == o_.skip.end()) budgets.push_back(lt::parse_bytes(b));
    }
    if (budgets.empty()) return;
    const int64_t cap = *std::max_element(budgets.begin(), budgets.end());

    // The planner's fixed part (parameters + gradients + AdamW moments): a cell below it is
    // refused by the planner and the sweep need not run anything under it.
    int64_t fixed = -1;
    {
      lt::trainers::PlanOptions po;
      po.budget = 1;
      try {
        lt::trainers::make_plan(lt::parse_config(spec.toml, spec.name), ctx0, 1, po);
      } catch (const lt::ConfigError& e) {
        const std::string w = e.what();
        const auto at = w.find("at least ");
        if (at != std::string::npos) fixed = std::stoll(w.substr(at + 9));
      }
    }

    // The sweep (Note [Sweep once per model]).
    std::vector<std::pair<Candidate, Measured>> sweep;
    std::vector<int64_t> micros;
    for (int64_t m = 1; m <= spec.global_batch; m *= 2)
      if (spec.global_batch % m == 0) micros.push_back(m);
    for (const auto& prec : spec.sweep_precisions)
      for (const char* pol : {"none", "selective", "full"}) {
        bool out = cap < fixed;
        for (const int64_t m : micros) {
          Candidate c{prec, pol, m};
          Measured r;
          if (out) {
            r.why = cap < fixed ? "below the fixed part" : "a smaller micro-batch did not fit";
          } else {
            r = measure(spec, c, cap);
            out = !r.fits;
          }
          sweep.emplace_back(c, r);
        }
      }
    sweep_md_ << "\n### " << spec.name << ", global batch " << spec.global_batch << " (sweep under "
              << gib(cap) << ")\n\n| precision | checkpoint | micro x accum | peak | samples/s | status |\n"
              << "|---|---|---|---|---|---|\n";
    for (const auto& [c, r] : sweep)
      sweep_md_ << "| " << c.precision << " | " << c.policy << " | " << c.micro << "x" << spec.global_batch / c.micro
                << " | " << gib(r.peak) << " | " << (r.fits ? fmt("%.3f", r.sps) : "-") << " | "
                << (r.fits ? "ok" : r.why.substr(0, 80)) << " |\n";

    for (const int64_t budget : budgets) run_cell(spec, ctx0, budget, fixed, sweep);
  }

  void run_cell(const ModelSpec& spec, const lt::RuntimeContext& ctx, int64_t budget, int64_t fixed,
                const std::vector<std::pair<Candidate, Measured>>& sweep) {
    std::ostringstream row;
    row << "| " << spec.name << " | " << gib(budget) << " | " << gib(fixed) << " | ";
    // The best of the sweep under this budget, verified by a run under it.
    const Candidate* best = nullptr;
    double best_sps = 0;
    for (const auto& [c, r] : sweep)
      if (r.fits && r.peak <= budget && r.sps > best_sps) best = &c, best_sps = r.sps;
    // The plan.
    lt::trainers::PlanOptions po;
    po.budget = budget;
    po.margin = o_.margin;
    lt::trainers::Plan plan;
    std::string refused;
    const auto t0 = Clock::now();
    try {
      plan = lt::trainers::make_plan(lt::parse_config(spec.toml, spec.name), ctx, 1, po);
    } catch (const lt::ConfigError& e) {
      refused = e.what();
    }
    const double plan_s = std::chrono::duration<double>(Clock::now() - t0).count();
    std::fprintf(stderr, "[bench] %s budget %s: planned in %.1f s%s\n%s", spec.name.c_str(), gib(budget).c_str(),
                 plan_s, refused.empty() ? "" : (": refused: " + refused).c_str(),
                 refused.empty() ? lt::trainers::plan_table(plan).c_str() : "");
    if (!refused.empty()) {
      const bool below = refused.find("below the fixed part") != std::string::npos;
      row << "refused (" << (below ? "below the fixed part" : "nothing fits") << ", exit 2) | - | - | "
          << (best ? "**" + best->text(spec.global_batch) + " fits: disagrees**" : std::string("none fits: agrees"))
          << " | - | - | - | - | " << fmt("%.1f", plan_s) << " | - |\n";
      table_md_ << row.str();
      return;
    }
    const auto& ch = plan.choice();
    const Candidate planned{ch.precision, ch.policy, ch.micro_batch};
    const Measured pv = measure(spec, planned, budget);
    row << planned.text(spec.global_batch) << " | "
        << (pv.fits ? gib(pv.peak) + (pv.peak <= budget ? " ok" : " **over**") : "**" + pv.why + "**") << " | "
        << (pv.fits ? fmt("%.3f", pv.sps) : "-") << " | ";
    // planned / best: both from the sweep's runs (the same conditions); the verify runs give
    // the peaks under the budget.
    double planned_sweep_sps = -1;
    for (const auto& [c, r] : sweep)
      if (c.precision == planned.precision && c.policy == planned.policy && c.micro == planned.micro && r.fits)
        planned_sweep_sps = r.sps;
    if (planned_sweep_sps < 0) planned_sweep_sps = pv.sps;  // not swept (e.g. a precision the sweep leaves out)
    if (best) {
      const Measured bv = measure(spec, *best, budget);
      row << best->text(spec.global_batch) << (bv.fits && bv.peak <= budget ? "" : " (**" + bv.why + " under the budget**)")
          << " | " << fmt("%.3f", best_sps) << " | " << fmt("%.2fx", planned_sweep_sps / best_sps) << " | ";
    } else {
      row << "none fits | - | - | ";
    }
    // The manual recipe, from the sweep's measurements (a user tries and sees: no margin).
    auto find = [&](const std::string& p, const std::string& pol, int64_t m) -> const Measured* {
      for (const auto& [c, r] : sweep)
        if (c.precision == p && c.policy == pol && c.micro == m) return &r;
      return nullptr;
    };
    std::string manual;
    double manual_sps = -1;
    bool needs_full = false;
    if (!find("bf16", "none", 1)) {
      manual = "bf16 not swept";
    } else {
      // bf16 at the whole batch, then halve the micro-batch (accumulation doubles) until it fits.
      for (int64_t m = spec.global_batch; m >= 1 && manual.empty(); m /= 2) {
        const Measured* r = find("bf16", "none", m);
        if (r && r->fits && r->peak <= budget) manual = Candidate{"bf16", "none", m}.text(spec.global_batch), manual_sps = r->sps;
      }
      // Still not at micro-batch 1: full recompute at the largest micro-batch that fits.
      for (int64_t m = spec.global_batch; m >= 1 && manual.empty(); m /= 2) {
        const Measured* r = find("bf16", "full", m);
        if (r && r->fits && r->peak <= budget) {
          manual = Candidate{"bf16", "full", m}.text(spec.global_batch), manual_sps = r->sps;
          needs_full = true;
        }
      }
      if (manual.empty()) manual = "does not fit";
    }
    row << manual << " | " << (manual_sps > 0 ? fmt("%.3f", manual_sps) : "-") << " | "
        << (manual_sps > 0 ? fmt("%.2fx", planned_sweep_sps / manual_sps) + (needs_full ? " (full ckpt)" : "") : "-")
        << " | " << fmt("%.1f", plan_s) << " | ";
    if (pv.fits) row << fmt("%.2f%%", 100.0 * plan_s / (plan_s + 1000.0 * pv.step_s));
    else row << "-";
    row << " |\n";
    table_md_ << row.str();
  }

  std::string report() const {
    std::ostringstream o;
    o << "| model | budget | fixed part | planned (prec/ckpt/micro x accum) | planned peak (run under the budget) | "
         "planned samples/s | sweep best | best samples/s | planned/best | manual recipe | manual samples/s | "
         "planned/manual | planning s | planning share of 1,000 steps |\n"
      << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
      << table_md_.str() << "\nSweeps (" << o_.warmup << " warm-up + " << o_.steps
      << " timed steps a candidate):\n" << sweep_md_.str();
    return o.str();
  }

 private:
  const Options& o_;
  int runs_ = 0;
  std::map<std::tuple<std::string, Candidate, int64_t>, Measured> cache_;
  std::ostringstream table_md_, sweep_md_;
};

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    for (int i = 1; i < argc; i += 2) {
      const std::string k = argv[i];
      if (i + 1 >= argc) throw lt::ConfigError(k + ": needs a value");
      const std::string v = argv[i + 1];
      if (k == "--models") o.models = split(v);
      else if (k == "--budgets") o.budgets = split(v);
      else if (k == "--skip") o.skip = split(v);
      else if (k == "--steps") o.steps = std::stoi(v);
      else if (k == "--warmup") o.warmup = std::stoi(v);
      else if (k == "--seq") o.seq = std::stoll(v);
      else if (k == "--image") o.image = std::stoll(v);
      else if (k == "--gpt-batch") o.gpt_batch = std::stoll(v);
      else if (k == "--resnet-batch") o.resnet_batch = std::stoll(v);
      else if (k == "--gpt-sweep-precisions") o.gpt_precisions = split(v);
      else if (k == "--resnet-sweep-precisions") o.resnet_precisions = split(v);
      else if (k == "--margin") o.margin = std::stod(v);
      else if (k == "--out") o.out = v;
      else if (k == "--work") o.work = v;
      else throw lt::ConfigError("unknown option " + k);
    }
    if (o.steps < 1 || o.warmup < 0) throw lt::ConfigError("--steps must be >= 1 and --warmup >= 0");
    for (const auto& b : o.budgets) lt::parse_bytes(b);
  } catch (const std::exception& e) {
    std::cerr << "leantrain_bench_planner: " << e.what() << "\n";
    return 2;
  }
  if (o.work.empty()) o.work = "/tmp/leantrain_bench_planner." + std::to_string(getpid());
  lt::files::make_dirs(o.work);
  lt::log::init(0, 1, false);
  const auto t0 = Clock::now();
  Bench bench(o);
  try {
    for (const auto& m : o.models) bench.run_model(m);
  } catch (const lt::ConfigError& e) {
    std::cerr << "leantrain_bench_planner: " << e.what() << "\n";
    return 2;
  } catch (const c10::Error& e) {
    std::cerr << "leantrain_bench_planner: error: " << e.what_without_backtrace() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "leantrain_bench_planner: " << e.what() << "\n";
    return 1;
  }
  lt::files::remove_tree(o.work);
  const std::string md = bench.report() + fmt("\nTotal bench time: %.0f s", std::chrono::duration<double>(Clock::now() - t0).count()) +
                         ", on " + cpu_text(cpu_info()) + ".\n";
  std::cout << md;
  if (!o.out.empty()) lt::files::write_atomic(o.out, md);
  return 0;
}
