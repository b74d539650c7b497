// A user's training program: their model (tiny_vit.h) and dataset (bars_dataset.h), trained by
// leantrain's Trainer with bf16, full recompute of the encoder blocks, gradient accumulation,
// one rank per process under mpirun, and FP32 HDF5 checkpoints it can resume from.
//
//   mpirun -np 2 custom_model --out runs/vit [--resume auto|PATH] [--set train.steps=60]...
//
// The config is leantrain's (every [train], [precision], [memory], [checkpoint], [comm] and
// [log] key; --set overrides any of them). [model] and [data] describe leantrain's built-in
// components and are not used here: the model and the data come from this file.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bars_dataset.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"
#include "leantrain/trainers/trainer.h"
#include "tiny_vit.h"

namespace {

const char* kConfig = R"(
[data]
seed = 7
[train]
global_batch = 32        # 2 ranks x micro-batch 8 x accumulation 2
micro_batch = 8
steps = 40
optimizer = "adamw"
lr = 2e-3
schedule = "constant"    # the same learning rate whatever train.steps is
grad_clip = 1.0
eval_batch = 128
[precision]
mode = "bf16"
[memory]
recompute = "full"   # recompute every encoder block in backward
[checkpoint]
every_steps = 10
[log]
progress = "plain"
every_steps = 10
)";

int usage(const std::string& why) {
  std::cerr << "custom_model: " << why << "\nusage: custom_model --out DIR [--resume auto|PATH] [--set key=value]...\n";
  return lt::kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  std::vector<std::string> sets;
  lt::trainers::StartOptions start;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 == argc) return usage(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--out") out = v;
    else if (a == "--resume") start.resume = v;
    else if (a == "--set") sets.push_back(v);
    else return usage("unknown option " + a);
  }
  if (out.empty()) return usage("--out DIR is required");

  const lt::World world = lt::detect_world();
  lt::log::init(world.rank, world.size, false);
  std::unique_ptr<lt::comm::Communicator> comm;
  try {
    const lt::Config cfg = lt::parse_config(kConfig, "custom_model", sets);
    // First the runtime context (device, threads, the CPU memory tracker), then the components.
    const lt::RuntimeContext ctx = lt::make_runtime_context(cfg, world);
    comm = lt::comm::make_communicator(cfg.comm, ctx);
    torch::manual_seed(cfg.data.seed);  // the same initial weights on every rank
    example::TinyVitOptions vit;
    lt::trainers::Components parts{std::make_shared<example::TinyVit>(vit),
                                   std::make_shared<example::BarsDataset>(4096, cfg.data.seed, vit.image),
                                   std::make_shared<example::BarsDataset>(512, cfg.data.seed + 1, vit.image),
                                   "TinyVit"};
    lt::trainers::TrainerOptions opt;
    opt.out_dir = out;
    opt.start = start;
    lt::trainers::Trainer trainer(cfg, parts, ctx, *comm, opt);
    const auto s = trainer.run();
    if (world.rank == 0)
      std::cout << "custom_model: " << s.steps << " steps, final loss " << s.final_loss << ", eval loss "
                << s.eval_loss << ", eval accuracy " << s.eval_accuracy << std::endl;
    return s.preempted ? lt::kExitPreempted : lt::kExitOk;
  } catch (const lt::ConfigError& e) {
    std::cerr << "custom_model: " << e.what() << std::endl;
    if (comm && comm->size() > 1) comm->abort(lt::kExitUsage);
    return lt::kExitUsage;
  } catch (const std::exception& e) {
    std::cerr << "custom_model: rank " << world.rank << ": " << e.what() << std::endl;
    if (comm && comm->size() > 1) comm->abort(lt::kExitFailure);  // the other ranks may be waiting on us
    return lt::kExitFailure;
  }
}
