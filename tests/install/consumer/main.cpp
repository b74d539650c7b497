// Uses the installed leantrain through find_package(leantrain): each layer for real, printing
// `key value` lines that tests/install/run.sh checks.
//   consumer OUT_DIR
#include <cmath>
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "leantrain/checkpoint_io/checkpoint.h"
#include "leantrain/comm/communicator.h"
#include "leantrain/models/model.h"
#include "leantrain/models/registry.h"
#include "leantrain/runtime/config.h"
#include "leantrain/runtime/runtime_context.h"
#include "leantrain/runtime/world.h"
#include "leantrain/trainers/schedule.h"
#include "leantrain/trainers/trainer.h"

#if __has_include("all_headers.h")
#include "all_headers.h"  // every installed header (CMakeLists.txt)
#endif
#ifndef LEANTRAIN_CONSUMER_HEADERS
#define LEANTRAIN_CONSUMER_HEADERS 0
#endif

namespace {

const char* kConfig = R"(
[model]
kind = "mlp"
image_size = 8
in_channels = 1
num_classes = 4
hidden = [32]

[train]
global_batch = 16
micro_batch = 16
lr = 0.05
schedule = "constant"
device = "cpu"
threads = 1

[comm]
backend = "local"
)";

int run(const std::string& out_dir) {
  // runtime: parse and validate a config (an override in TOML syntax, as --set takes).
  // trainers: resolve [model] and [data] through the registries (the kinds' tables).
  lt::Config cfg = lt::trainers::resolve_components(lt::parse_config(kConfig, "consumer.toml", {"data.seed=7"}));
  lt::validate(cfg, 1);
  std::printf("config model=%s hidden=%lld seed=%llu\n", cfg.model.kind.c_str(),
              static_cast<long long>(cfg.model.options.integers("hidden").at(0)),
              static_cast<unsigned long long>(cfg.data.seed));

  lt::RuntimeContext ctx = lt::make_runtime_context(cfg, lt::detect_world());

  // comm: the backend comm.backend picks, a world of one.
  std::unique_ptr<lt::comm::Communicator> comm = lt::comm::make_communicator(cfg.comm, ctx);
  torch::Tensor ones = torch::ones({3});
  comm->allreduce_sum(ones);
  std::printf("comm backend=%s rank=%d size=%d sum=%g\n", comm->backend().c_str(), comm->rank(),
              comm->size(), ones.sum().item<double>());

  // models: forward, backward, one plain SGD step at the schedule's learning rate (trainers).
  torch::manual_seed(static_cast<uint64_t>(cfg.data.seed));
  std::shared_ptr<lt::models::Model> model = lt::models::build_model(cfg.model);
  const lt::InputContract in = lt::models::model_contract(cfg.model);
  torch::Tensor x = torch::randn({cfg.train.micro_batch, in.channels, in.height, in.width});
  torch::Tensor y = torch::randint(in.num_classes, {cfg.train.micro_batch}, torch::kLong);
  const double lr = lt::trainers::lr_at(cfg.train, 1, 10);
  torch::Tensor loss = model->forward_loss(x, y);
  loss.backward();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.sub_(lr * p.grad());
  }
  const double loss_after = model->forward_loss(x, y).item<double>();
  std::printf("model parameters=%lld task=%s\n",
              static_cast<long long>(lt::models::count_parameters(*model)),
              lt::models::task_name(model->task()));
  std::printf("train lr=%g loss=%.6f loss_after=%.6f\n", lr, loss.item<double>(), loss_after);

  // checkpoint_io: write the model as an HDF5 checkpoint, read it back, compare bit for bit.
  lt::checkpoint_io::Checkpoint c;
  c.step = 1;
  c.config = lt::config_to_json(cfg);
  for (const auto& item : model->named_parameters()) {
    c.model.push_back({item.key(), item.value().detach().clone().contiguous()});
  }
  const std::string path = out_dir + "/consumer.h5";
  lt::checkpoint_io::write_checkpoint(path, c);
  lt::checkpoint_io::Checkpoint back = lt::checkpoint_io::read_checkpoint(path);
  std::map<std::string, torch::Tensor> read;
  for (const auto& t : back.model) read[t.name] = t.tensor;
  bool equal = back.step == c.step && read.size() == c.model.size() && !c.model.empty();
  for (const auto& t : c.model) {
    auto it = read.find(t.name);
    equal = equal && it != read.end() && torch::equal(it->second, t.tensor);
  }
  std::printf("headers included=%d\n", LEANTRAIN_CONSUMER_HEADERS);
  std::printf("checkpoint tensors=%zu step=%lld equal=%d\n", back.model.size(),
              static_cast<long long>(back.step), equal ? 1 : 0);
  return equal ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer OUT_DIR\n");
    return 2;
  }
  try {
    return run(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
