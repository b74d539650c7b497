#include "leantrain/trainers/checkpointing.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "leantrain/optim/sharded_optimizer.h"
#include "leantrain/runtime/errors.h"
#include "leantrain/runtime/files.h"
#include "leantrain/runtime/log.h"
#include "leantrain/runtime/runtime_context.h"

#ifndef LEANTRAIN_VERSION
#define LEANTRAIN_VERSION "unknown"
#endif

namespace lt::trainers {

using checkpoint_io::Checkpoint;
using checkpoint_io::CheckpointError;
using checkpoint_io::NamedTensor;

std::string checkpoint_dir(const Config& cfg, const std::string& out_dir) {
  return cfg.checkpoint.dir.empty() ? files::join(out_dir, "checkpoints") : cfg.checkpoint.dir;
}

std::vector<NamedTensor> model_tensors(torch::nn::Module& model) {
  std::vector<NamedTensor> out;
  for (const auto& p : model.named_parameters()) out.push_back({p.key(), p.value()});
  for (const auto& b : model.named_buffers()) out.push_back({b.key(), b.value()});
  return out;
}

namespace {

torch::Tensor to_host(const torch::Tensor& t, bool copy) {
  auto d = t.detach();
  if (!d.device().is_cpu()) return d.to(torch::kCPU);  // a copy already
  return copy ? d.clone(at::MemoryFormat::Contiguous) : d.contiguous();
}

torch::Tensor step_tensor(int64_t step) { return torch::full({}, step, torch::TensorOptions().dtype(torch::kLong)); }

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> named_parameters_of(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

Checkpoint capture_state(const Config& cfg, int world, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                         const LossScaler& scaler, int64_t step, int64_t steps_per_epoch, bool copy,
                         std::vector<NamedTensor>* gathered) {
  torch::NoGradGuard no_grad;
  Checkpoint c;
  c.step = step;
  c.epoch = steps_per_epoch > 0 ? step / steps_per_epoch : 0;
  c.samples_seen = step * cfg.train.global_batch;
  c.world_size = world;
  c.global_batch = cfg.train.global_batch;
  c.micro_batch = cfg.train.micro_batch;
  c.accumulation = accumulation_steps(cfg.train, world);
  c.precision = cfg.precision.mode;
  const auto j = nlohmann::json::parse(config_to_json(cfg));
  c.config = j.dump();
  c.model_config = j.at("model").dump();
  c.train_config = j.at("train").dump();
  c.leantrain_version = LEANTRAIN_VERSION;
  c.libtorch_version = torch_version();

  for (auto& nt : model_tensors(model)) {
    // Parameters are FP32 whatever the precision mode (autocast casts per op).
    c.model.push_back({nt.name, to_host(nt.tensor, copy)});
  }
  c.optimizer_kind = cfg.train.optimizer;
  c.optimizer_attrs = {{"lr", cfg.train.lr},           {"weight_decay", cfg.train.weight_decay},
                       {"beta1", cfg.train.beta1},     {"beta2", cfg.train.beta2},
                       {"eps", cfg.train.eps},         {"momentum", cfg.train.momentum}};
  auto* sharded = dynamic_cast<optim::ShardedOptimizer*>(&optimizer);
  if (gathered) c.optimizer = std::move(*gathered);                          // Note [Sharded checkpoints]
  else if (sharded) c.optimizer = sharded->full_state(named_parameters_of(model));  // unsharded 8-bit: local
  else
    for (const auto& p : model.named_parameters()) {  // torch::optim's state per parameter
      auto it = optimizer.state().find(p.value().unsafeGetTensorImpl());
      if (it == optimizer.state().end()) continue;  // no step taken yet for this parameter
      const std::string& n = p.key();
      if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
        c.optimizer.push_back({n + "/step", step_tensor(s->step())});
        c.optimizer.push_back({n + "/exp_avg", to_host(s->exp_avg(), copy)});
        c.optimizer.push_back({n + "/exp_avg_sq", to_host(s->exp_avg_sq(), copy)});
        if (s->max_exp_avg_sq().defined())
          c.optimizer.push_back({n + "/max_exp_avg_sq", to_host(s->max_exp_avg_sq(), copy)});
      } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
        if (m->momentum_buffer().defined())
          c.optimizer.push_back({n + "/momentum_buffer", to_host(m->momentum_buffer(), copy)});
      }
    }
  c.scaler = {{"scale", scaler.scale_value()},
              {"growth_tracker", static_cast<double>(scaler.growth_tracker())},
              {"enabled", scaler.enabled() ? 1.0 : 0.0},
              {"init_scale", cfg.precision.init_scale},
              {"growth_factor", cfg.precision.growth_factor},
              {"backoff_factor", cfg.precision.backoff_factor},
              {"growth_interval", static_cast<double>(cfg.precision.growth_interval)}};
  c.data = {{"seed", static_cast<int64_t>(cfg.data.seed)},
            {"epoch", c.epoch},
            {"position", steps_per_epoch > 0 ? step % steps_per_epoch : 0},
            {"steps_per_epoch", steps_per_epoch}};
  return c;
}

void restore_state(const Checkpoint& c, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                   LossScaler& scaler) {
  torch::NoGradGuard no_grad;
  std::map<std::string, const torch::Tensor*> saved;
  for (const auto& nt : c.model) saved[nt.name] = &nt.tensor;
  for (auto& nt : model_tensors(model)) nt.tensor.copy_(*saved.at(nt.name));

  std::map<std::string, std::map<std::string, const torch::Tensor*>> opt;
  for (const auto& nt : c.optimizer) {
    const auto slash = nt.name.rfind('/');
    opt[nt.name.substr(0, slash)][nt.name.substr(slash + 1)] = &nt.tensor;
  }
  auto* sharded = dynamic_cast<optim::ShardedOptimizer*>(&optimizer);
  const bool adamw = sharded ? sharded->adamw() : dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr;
  if (!opt.empty() && c.optimizer_kind != (adamw ? "adamw" : "sgd"))
    throw CheckpointError("the checkpoint holds " + c.optimizer_kind +
                          " optimizer state; this run's train.optimizer differs (use --init-from to start a "
                          "new optimizer from its weights)");
  if (sharded) {
    sharded->load_full_state(named_parameters_of(model), [&](const std::string& name, const std::string& key) {
      auto it = opt.find(name);
      if (it == opt.end()) return static_cast<const torch::Tensor*>(nullptr);
      auto f = it->second.find(key);
      return f == it->second.end() ? static_cast<const torch::Tensor*>(nullptr) : f->second;
    });
  } else {
    auto& state = optimizer.state();
    state.clear();
    for (const auto& p : model.named_parameters()) {
      auto it = opt.find(p.key());
      if (it == opt.end()) continue;
      const auto& s = it->second;
      auto get = [&](const std::string& k) -> torch::Tensor {
        auto f = s.find(k);
        if (f == s.end()) throw CheckpointError("optimizer state " + p.key() + "/" + k + " is missing");
        if (f->second->sizes() != p.value().sizes() && f->second->dim() != 0)
          throw CheckpointError("optimizer state " + p.key() + "/" + k + " has the wrong shape");
        return f->second->to(p.value().device()).clone();
      };
      if (c.optimizer_kind == "adamw") {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(get("step").item<int64_t>());
        st->exp_avg(get("exp_avg"));
        st->exp_avg_sq(get("exp_avg_sq"));
        if (s.count("max_exp_avg_sq")) st->max_exp_avg_sq(get("max_exp_avg_sq"));
        state[p.value().unsafeGetTensorImpl()] = std::move(st);
      } else {
        auto st = std::make_unique<torch::optim::SGDParamState>();
        st->momentum_buffer(get("momentum_buffer"));
        state[p.value().unsafeGetTensorImpl()] = std::move(st);
      }
    }
  }
  if (c.scaler.count("scale"))
    scaler.load(c.scaler.at("scale"), static_cast<int64_t>(c.scaler.at("growth_tracker")));
}

std::optional<Checkpoint> load_for_resume(const std::string& resume, const std::string& dir,
                                          torch::nn::Module& model, comm::Communicator& comm,
                                          std::string* chosen_path) {
  const auto expected = model_tensors(model);
  // Note [Collective resume]: rank 0 decides which file (so an `auto` fallback is the same
  // everywhere), broadcasts its step (-1: none found, -2: failed), and every rank reads and
  // verifies that file itself; then all ranks agree on success before anyone proceeds.
  std::string path, error;
  std::optional<Checkpoint> loaded;
  auto decision = torch::zeros({1}, torch::kLong);
  if (comm.rank() == 0) {
    std::vector<std::string> candidates;
    if (resume == "auto") {
      candidates = checkpoint_io::list_checkpoints(dir);
      if (candidates.empty()) log::info("--resume auto: no checkpoint in " + dir + "; starting from step 0");
    } else {
      candidates = {resume};
    }
    for (const auto& cand : candidates) {
      try {
        auto c = checkpoint_io::read_checkpoint(cand);
        checkpoint_io::check_model(c, expected, cand);
        path = cand;
        loaded = std::move(c);
        break;
      } catch (const CheckpointError& e) {
        error = e.what();
        if (resume == "auto") log::warn(std::string("skipping damaged checkpoint: ") + e.what());
      }
    }
    decision[0] = loaded ? loaded->step : (candidates.empty() ? -1 : -2);
  }
  comm.broadcast(decision, 0);
  const int64_t d = decision[0].item<int64_t>();
  if (d == -1) return std::nullopt;
  if (comm.rank() != 0 && d >= 0) {
    path = resume == "auto" ? files::join(dir, checkpoint_io::checkpoint_filename(d)) : resume;
    try {
      auto c = checkpoint_io::read_checkpoint(path);
      checkpoint_io::check_model(c, expected, path);
      loaded = std::move(c);
    } catch (const CheckpointError& e) {
      error = e.what();
    }
  }
  auto failed = torch::full({1}, loaded ? 0.0 : 1.0, torch::kDouble);
  comm.allreduce_sum(failed);
  if (failed[0].item<double>() > 0) {
    if (!error.empty()) throw CheckpointError(resume == "auto" ? "no usable checkpoint in " + dir + ": " + error : error);
    throw CheckpointError("another rank could not read checkpoint " + path + " (see its message)");
  }
  if (chosen_path != nullptr) *chosen_path = path;
  return loaded;
}

CheckpointWriter::CheckpointWriter(std::string dir, int64_t keep_last, bool async, Done done)
    : dir_(std::move(dir)), keep_last_(keep_last), async_(async), done_(std::move(done)) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

// `stall_s` < 0: the write is on the training thread, so it stalls training until it ends.
void CheckpointWriter::write(const Checkpoint& c, double stall_s, Clock::time_point since) {
  checkpoint_io::WriteStats stats;
  try {
    stats = checkpoint_io::commit_checkpoint(dir_, c, keep_last_);
  } catch (const CheckpointError& e) {
    throw StorageError(std::string(e.what()) + "; the checkpoints written before it in " + dir_ + " are intact");
  }
  if (stall_s < 0) stall_s = std::chrono::duration<double>(Clock::now() - since).count();
  if (done_) done_(files::join(dir_, checkpoint_io::checkpoint_filename(c.step)), stats, stall_s);
}

void CheckpointWriter::write_now(const Checkpoint& c, Clock::time_point since) {
  wait();
  write(c, -1, since);
}

void CheckpointWriter::submit(Checkpoint c, Clock::time_point since) {
  wait();
  if (!async_) {
    write(c, -1, since);
    return;
  }
  // Known before the thread starts (its creation orders this write before the thread's read).
  const double stall_s = std::chrono::duration<double>(Clock::now() - since).count();
  // The writer runs on the trainer's device (a new thread's current device is 0, whatever
  // the rank's: Note [Rank to GPU] in runtime_context.h).
  thread_ = std::thread([this, c = std::move(c), stall_s, since, device = bound_device()] {
    try {
      bind_device(device);
      write(c, stall_s, since);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

void CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  if (error_) {
    auto e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

}  // namespace lt::trainers
