// A user's training program: their model (tiny_vit.h) and dataset (bars_dataset.h), trained by
// leantrain's Trainer with bf16, full recompute of the encoder blocks, gradient accumulation,
// one rank per process under mpirun, and FP32 HDF5 checkpoints it can resume from.
//
//   mpirun -np 2 custom_model --out runs/vit [--resume auto|PATH] [--set train.steps=60]...
//
// The model and the data are registered by name (register_components below), each with its
// options table and the model's input contract, so the config picks them as it picks a
// built-in: [model] kind = "tiny_vit", [data] kind = "bars". `--set model.depth=6` works,
// `--set model.dpeth=6` is a config error listing tiny_vit's keys, and config.json records
// every option. Nothing in leantrain names them.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "bars_dataset.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/data/registry.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"
#include "leantrain/trainers/trainer.h"
#include "tiny_vit.h"

namespace {

const char* kConfig = R"(
[model]
kind = "tiny_vit"
depth = 4
[data]
kind = "bars"
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

// tiny_vit's options, bound to TinyVitOptions (whose initializers are the defaults).
lt::BoundOptions<example::TinyVitOptions> vit_options() {
  using O = example::TinyVitOptions;
  lt::BoundOptions<O> b;
  b.add("image", &O::image, "input height = width", lt::rules::at_least(1))
      .add("patch", &O::patch, "patch side; must divide image", lt::rules::at_least(1))
      .add("channels", &O::channels, "input channels", lt::rules::at_least(1))
      .add("classes", &O::classes, "output classes", lt::rules::at_least(2))
      .add("dim", &O::dim, "width", lt::rules::at_least(1))
      .add("heads", &O::heads, "attention heads; must divide dim", lt::rules::at_least(1))
      .add("depth", &O::depth, "encoder blocks", lt::rules::at_least(1));
  return b;
}

struct BarsOptions {
  int64_t train_samples = 4096, eval_samples = 512;
};

void register_components() {
  const auto vit = vit_options();
  lt::models::ModelKind model;
  model.name = "tiny_vit";
  model.doc = "A small vision transformer (examples/custom_model/tiny_vit.h).";
  model.options = vit.table();
  model.check = [vit](const lt::Options& o) {
    const auto v = vit.read(o);
    if (v.image % v.patch != 0) throw lt::ConfigError("model.patch = " + std::to_string(v.patch) + ": must divide model.image");
    if (v.dim % v.heads != 0) throw lt::ConfigError("model.heads = " + std::to_string(v.heads) + ": must divide model.dim");
  };
  model.contract = [vit](const lt::Options& o) {
    const auto v = vit.read(o);
    lt::InputContract c;  // images [B, channels, image, image] -> labels of `classes` classes
    c.channels = v.channels;
    c.height = c.width = v.image;
    c.num_classes = v.classes;
    c.channels_key = "model.channels";
    c.size_key = "model.image";
    c.num_classes_key = "model.classes";
    return c;
  };
  model.build = [vit](const lt::Options& o) { return std::make_shared<example::TinyVit>(vit.read(o)); };
  lt::models::register_model(std::move(model));

  lt::BoundOptions<BarsOptions> bars;
  bars.add("train_samples", &BarsOptions::train_samples, "training samples", lt::rules::at_least(1))
      .add("eval_samples", &BarsOptions::eval_samples, "evaluation samples", lt::rules::at_least(1));
  lt::data::DataKind data;
  data.name = "bars";
  data.doc = "Grey images of a bar in one of four orientations (examples/custom_model/bars_dataset.h).";
  data.options = bars.table();
  data.make = [bars](const lt::Options& o, uint64_t seed, const lt::InputContract& model) {
    const auto b = bars.read(o);
    if (model.input != lt::InputContract::Input::kImages || model.channels != 1 || model.height != model.width ||
        model.num_classes != 4)
      throw lt::ConfigError("data.kind = \"bars\" gives images [B,1,S,S] with labels of 4 classes; the model takes " +
                            model.describe());
    return lt::data::Datasets{std::make_shared<example::BarsDataset>(b.train_samples, seed, model.height),
                              std::make_shared<example::BarsDataset>(b.eval_samples, seed + 1, model.height)};
  };
  lt::data::register_data(std::move(data));
}

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
    register_components();
    const lt::Config cfg = lt::trainers::resolve_components(lt::parse_config(kConfig, "custom_model", sets));
    lt::validate(cfg, world.size);
    // First the runtime context (device, threads, the CPU memory tracker), then the components
    // (make_components seeds torch with data.seed: the same initial weights on every rank).
    const lt::RuntimeContext ctx = lt::make_runtime_context(cfg, world);
    comm = lt::comm::make_communicator(cfg.comm, ctx);
    lt::trainers::TrainerOptions opt;
    opt.out_dir = out;
    opt.start = start;
    lt::trainers::Trainer trainer(cfg, lt::trainers::make_components(cfg), ctx, *comm, opt);
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
