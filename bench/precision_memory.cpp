// Benchmark: peak activation memory and step time of fp32/bf16 x none/selective/full
// activation recompute, each printed as a ratio to a baseline measured in the same run
// (activations: fp32 + none; step time: the same precision with none).
//
//   build/bin/leantrain_bench_memory [--model gpt|resnet50|all] [--steps N] [--micro N] [--seq N]
//                                    [--layers N] [--image N] [--precisions fp32,bf16]
//                                    [--policies none,selective,full] [--out FILE.md]
//
// bf16 on a CPU without AVX-512 BF16 runs LibTorch's reference GEMM (very slow): there,
// measure bf16 at a reduced size or on a GPU.
//
// Every configuration runs the trainer's step (Trainer::train_step). Activation memory = the
// step's peak allocated bytes above what is allocated at its start and the gradients (the
// trainer's mem_activations_bytes); step time = its forward + backward.
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <thread>
#include <string>
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
  std::string model = "all";
  int steps = 2, micro = 8, seq = 512, layers = 12, image = 224;
  std::string out, memory_format = "channels_last";
  std::vector<std::string> precisions = {"fp32", "bf16"};
  std::vector<std::string> policies = {"none", "selective", "full"};
};

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  std::stringstream ss(v);
  for (std::string p; std::getline(ss, p, ',');) out.push_back(p);
  return out;
}

struct Row {
  std::string model, precision, policy;
  int64_t act_bytes = 0;
  double step_s = 0;
  double cpu_s = 0;  // process CPU time per step: steadier than wall time on a shared machine
};

// One configuration through the trainer's own step (Trainer::train_step) on synthetic data,
// with momentum- and decay-free SGD so the update allocates nothing: the activation
// figure is the trainer's (Note [Memory breakdown]: peak - step base - gradients), the time
// the step's forward + backward (StepResult::compute_s).
Row measure(const lt::models::ModelConfig& model_cfg, const std::string& precision, const std::string& policy,
            const Options& o) {
  lt::Config cfg;
  cfg.model = lt::models::builtin_model_section(model_cfg);
  cfg.data.kind = "synthetic";
  cfg.data.seed = 0;
  cfg.data.options.set("synthetic_samples", int64_t{std::max(64, o.micro * (o.steps + 1))});
  cfg.train.global_batch = cfg.train.micro_batch = o.micro;
  cfg.train.steps = o.steps + 1;
  cfg.train.optimizer = "sgd";
  cfg.train.momentum = 0;
  cfg.train.weight_decay = 0;  // SGD's decay allocates a parameter-sized temporary (154 MB for GPT's wte)
  cfg.train.grad_clip = 0;
  cfg.precision.mode = precision;
  cfg.memory.recompute = policy;
  lt::RuntimeContext ctx;
  ctx.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  lt::comm::LocalCommunicator comm;
  lt::trainers::Trainer trainer(cfg, lt::trainers::make_components(cfg), ctx, comm);
  trainer.train_step(0);  // warm-up: allocates gradients, primes oneDNN
  Row r{model_cfg.kind == "gpt" ? "GPT-" + std::to_string(model_cfg.n_layer) + "L d" + std::to_string(model_cfg.d_model)
                                : (model_cfg.memory_format == "channels_last" ? "ResNet-50" : "ResNet-50 (NCHW)"),
        precision, policy};
  double total = 0;
  for (int i = 1; i <= o.steps; ++i) {
    const std::clock_t c0 = std::clock();
    const auto step = trainer.train_step(i);
    total += step.compute_s;
    r.cpu_s += static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC / o.steps;
    r.act_bytes = std::max(r.act_bytes, step.activation_bytes());
  }
  r.step_s = total / o.steps;
  std::fprintf(stderr, "  %s %s %s: activations %s, step %.2f s (CPU time %.2f s)\n", r.model.c_str(),
               precision.c_str(), policy.c_str(), lt::format_bytes(r.act_bytes).c_str(), r.step_s, r.cpu_s);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  const int code = lt_bench::parse_args(
      argc, argv,
      "usage: leantrain_bench_memory [--model gpt|resnet50|all] [--precisions fp32,bf16]\n"
      "       [--policies none,selective,full] [--steps N] [--micro N] [--seq N] [--layers N]\n"
      "       [--image N] [--memory-format channels_last|contiguous (ResNet)] [--out FILE.md]\n",
      {}, [&o](const std::string& k, const std::string& v) {
        if (k == "--model") o.model = v;
        else if (k == "--steps") o.steps = std::stoi(v);
        else if (k == "--micro") o.micro = std::stoi(v);
        else if (k == "--seq") o.seq = std::stoi(v);
        else if (k == "--layers") o.layers = std::stoi(v);
        else if (k == "--image") o.image = std::stoi(v);
        else if (k == "--out") o.out = v;
        else if (k == "--memory-format") o.memory_format = v;
        else if (k == "--precisions") o.precisions = split(v);
        else if (k == "--policies") o.policies = split(v);
        else return false;
        return true;
      });
  if (code >= 0) return code;
  lt_bench::measure_cpu_memory();
  std::vector<lt::models::ModelConfig> models;
  if (o.model == "gpt" || o.model == "all") {
    models.push_back(lt_bench::gpt2_shape(o.layers, o.seq, 0.1));
  }
  if (o.model == "resnet50" || o.model == "all") {
    lt::models::ModelConfig r;
    r.kind = "resnet";
    r.depth = 50;
    r.in_channels = 3;
    r.image_size = o.image;
    r.num_classes = 1000;
    r.memory_format = o.memory_format;
    models.push_back(r);
  }
  if (o.memory_format != "contiguous" && o.memory_format != "channels_last") {
    std::cerr << "--memory-format " << o.memory_format << ": must be contiguous or channels_last\n";
    return 2;
  }
  if (models.empty()) {
    std::cerr << "--model " << o.model << ": must be gpt, resnet50 or all\n";
    return 2;
  }
  std::ostringstream md;
  md << "| model | precision | checkpoint | activations | vs fp32/none | step s | vs none (same precision) |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const auto& cfg : models) {
    std::vector<Row> rows;
    for (const auto& prec : o.precisions)
      for (const auto& pol : o.policies) rows.push_back(measure(cfg, prec, pol, o));
    for (const auto& r : rows) {
      const Row& base = rows[0];
      const Row* same_none = &rows[0];
      for (const auto& c : rows)
        if (c.precision == r.precision && c.policy == "none") same_none = &c;
      char line[256];
      std::snprintf(line, sizeof(line), "| %s | %s | %s | %s | %.2fx | %.2f | %.2fx |\n", r.model.c_str(),
                    r.precision.c_str(), r.policy.c_str(), lt::format_bytes(r.act_bytes).c_str(),
                    static_cast<double>(r.act_bytes) / static_cast<double>(base.act_bytes), r.step_s,
                    r.step_s / same_none->step_s);
      md << line;
    }
  }
  std::cout << md.str();
  if (!o.out.empty()) std::ofstream(o.out) << md.str();
  return 0;
}
