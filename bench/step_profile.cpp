// Where a training step's time goes, op by op: LibTorch's profiler (the legacy one, no Kineto
// needed) around the steps of a real Trainer built from a config file, after warm-up steps.
// For comparing leantrain's step with a peer's (bench/peers/): the same table in PyTorch is
// torch.profiler's key_averages() sorted by self CPU time.
//
//   build/bin/leantrain_bench_profile --config configs/gpt2_small.toml [--set key=value ...]
//                                     [--warmup 1] [--steps 2] [--top 25] [--shapes]
//
// --shapes: ops grouped by name and input shapes. Prints: per op, self time (its time less the ops it called), calls, share of the profiled
// steps' wall time, and the steps' own times. Nothing is asserted.
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/trainers/trainer.h"

namespace {

namespace prof = torch::autograd::profiler;

struct OpTime {
  double self_us = 0;
  int64_t calls = 0;
};

// Self time per op name from the legacy profiler's push/pop events, thread by thread.
std::string shapes_of(const prof::LegacyEvent& e) {
  std::string s;
  for (const auto& shape : e.shapes()) {
    s += s.empty() ? " [" : ", [";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    s += "]";
  }
  return s;
}

void add_self_times(const prof::thread_event_lists& threads, std::map<std::string, OpTime>& out, bool shapes) {
  for (const auto& events : threads) {
    struct Open {
      std::string name;
      double start_us, child_us;
    };
    std::vector<Open> stack;
    for (const auto& e : events) {
      if (e.kindStr() == "push") {
        stack.push_back({e.name() + (shapes ? shapes_of(e) : std::string()), events.front().cpuElapsedUs(e), 0.0});
      } else if (e.kindStr() == "pop" && !stack.empty()) {
        const Open o = stack.back();
        stack.pop_back();
        const double total = events.front().cpuElapsedUs(e) - o.start_us;
        auto& t = out[o.name];
        t.self_us += total - o.child_us;
        t.calls += 1;
        if (!stack.empty()) stack.back().child_us += total;
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string config;
  std::vector<std::string> sets;
  int warmup = 1, steps = 2, top = 25;
  bool shapes = false;
  const int code = lt_bench::parse_args(
      argc, argv,
      "usage: leantrain_bench_profile --config FILE [--set key=value ...] [--warmup 1] [--steps 2] [--top 25] "
      "[--shapes]\n",
      {"--shapes"}, [&](const std::string& k, const std::string& v) {
        if (k == "--shapes") shapes = true;
        else if (k == "--config") config = v;
        else if (k == "--set") sets.push_back(v);
        else if (k == "--warmup") warmup = std::stoi(v);
        else if (k == "--steps") steps = std::stoi(v);
        else if (k == "--top") top = std::stoi(v);
        else return false;
        return true;
      });
  if (code >= 0) return code;
  if (config.empty() || warmup < 0 || steps < 1) {
    std::cerr << "--config is required; --warmup >= 0, --steps >= 1\n";
    return 2;
  }
  try {
    const lt::Config cfg = lt::trainers::resolve_components(lt::load_config(config, sets));
    lt::RuntimeContext ctx;
    ctx.threads = cfg.train.threads > 0 ? cfg.train.threads
                                        : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    torch::set_num_threads(ctx.threads);
    lt::comm::LocalCommunicator comm;
    lt::trainers::Trainer trainer(cfg, lt::trainers::make_components(cfg), ctx, comm, {});
    int64_t step = 0;
    for (int i = 0; i < warmup; ++i) trainer.train_step(step++);
    std::map<std::string, OpTime> ops;
    std::vector<double> times;
    double wall_us = 0;
    {
      const torch::profiler::impl::ProfilerConfig pcfg(torch::profiler::impl::ProfilerState::CPU, shapes);
      prof::TLSLegacyProfilerGuard guard(pcfg,
                                         [&ops, shapes](const prof::thread_event_lists& r) { add_self_times(r, ops, shapes); });
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) times.push_back(trainer.train_step(step++).step_time_s);
      wall_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    }
    std::vector<std::pair<std::string, OpTime>> rows(ops.begin(), ops.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
    std::printf("%-90s %12s %8s %7s\n", "op", "self ms", "calls", "share");
    double listed = 0;
    for (int i = 0; i < static_cast<int>(rows.size()) && i < top; ++i) {
      const auto& [name, t] = rows[i];
      listed += t.self_us;
      std::printf("%-90.90s %12.1f %8lld %6.1f%%\n", name.c_str(), t.self_us / 1e3, static_cast<long long>(t.calls),
                  100.0 * t.self_us / wall_us);
    }
    std::printf("listed ops: %.1f ms of %.1f ms wall for %d steps; step times:", listed / 1e3, wall_us / 1e3, steps);
    for (double s : times) std::printf(" %.3f", s);
    std::printf(" s\n");
  } catch (const std::exception& e) {
    std::cerr << "leantrain_bench_profile: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
