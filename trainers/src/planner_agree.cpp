// One plan for every rank (train --auto under mpirun): rank 0 plans, the others take its choice.
#include <torch/torch.h>

#include <algorithm>

#include "leantrain/comm/communicator.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/trainers/planner.h"

namespace lt::trainers {

Plan agree_on_plan(const Config& cfg, const RuntimeContext& ctx, comm::Communicator& comm, const PlanOptions& opt) {
  if (comm.size() == 1) return make_plan(cfg, ctx, 1, opt);
  // Note [--auto across ranks]: every rank probing its own device could time its way to
  // another choice (the samples/s of close candidates differ by noise), and the ranks must
  // run one layout. Rank 0 plans; the others wait in the broadcast (setup deadline).
  static const std::vector<std::string> precisions = {"fp32", "bf16", "fp16"};
  static const std::vector<std::string> policies = {"none", "selective", "full"};
  static const std::vector<std::string> shards = {"none", "optimizer", "gradients"};
  static const std::vector<std::string> states = {"fp32", "int8"};
  auto index_of = [](const std::vector<std::string>& v, const std::string& s) {
    return static_cast<double>(std::find(v.begin(), v.end(), s) - v.begin());
  };
  Plan plan;
  std::string error;
  auto msg = torch::zeros({7}, torch::kDouble);  // ok, precision, policy, micro_batch, accumulation, shard, state
  if (comm.rank() == 0) {
    try {
      plan = make_plan(cfg, ctx, comm.size(), opt);
      const auto& c = plan.choice();
      msg = torch::tensor({1.0, index_of(precisions, c.precision), index_of(policies, c.policy),
                           static_cast<double>(c.micro_batch), static_cast<double>(c.accumulation),
                           index_of(shards, c.shard), index_of(states, c.optimizer_state)},
                          torch::kDouble);
    } catch (const ConfigError& e) {
      error = e.what();
    }
  }
  comm.set_timeout(cfg.comm.startup_timeout_s);
  comm.broadcast(msg, 0);
  if (msg[0].item<double>() == 0)
    throw ConfigError(comm.rank() == 0 ? error
                                       : "memory.budget = " + cfg.memory.budget +
                                             ": refused by the planner on rank 0 (its message says why and what "
                                             "budget it needs)");
  if (comm.rank() == 0) return plan;
  plan.budget = opt.budget;
  plan.margin = opt.margin;
  plan.limit = static_cast<int64_t>(static_cast<double>(opt.budget) * (1.0 - opt.margin));
  plan.world_size = comm.size();
  plan.global_batch = cfg.train.global_batch;
  PlanRow row;
  row.precision = precisions.at(static_cast<size_t>(msg[1].item<double>()));
  row.policy = policies.at(static_cast<size_t>(msg[2].item<double>()));
  row.micro_batch = static_cast<int64_t>(msg[3].item<double>());
  row.accumulation = static_cast<int64_t>(msg[4].item<double>());
  row.shard = shards.at(static_cast<size_t>(msg[5].item<double>()));
  row.optimizer_state = states.at(static_cast<size_t>(msg[6].item<double>()));
  row.fits = true;
  plan.rows.push_back(row);
  plan.chosen = 0;
  return plan;
}

}  // namespace lt::trainers
