#include "leantrain/optim/sharded_optimizer.h"

#include <torch/torch.h>

#include <map>
#include <stdexcept>

#include "leantrain/runtime/errors.h"

namespace lt::optim {

using checkpoint_io::CheckpointError;
using checkpoint_io::NamedTensor;

// Note [Sharded checkpoints]
// A checkpoint is the same file whatever memory.shard and memory.optimizer_state are: FP32
// weights and, per parameter, torch::optim's state tensors shaped as the parameter
// (CHECKPOINTS.md). Writing one from a sharded run, every rank copies its pieces' state
// (8-bit moments dequantised) into one zeroed chunk per bucket and the chunks are gathered to
// rank 0 bucket by bucket (GradientSync::gather_chunks: an all-gather of one bucket's chunks,
// which the other ranks drop at once), where each parameter's state is cut out of its bucket.
// Rank 0 then holds the full state, as the unsharded run's background writer's snapshot
// does; the others hold one bucket more for the moment of its gather. Reading one, every rank
// has the whole checkpoint (load_for_resume) and keeps the elements of its pieces: so a
// sharded checkpoint resumes unsharded, on another world size (the chunks fall elsewhere) or
// in another stage, and an unsharded one resumes sharded. A checkpoint has one step count
// per parameter; every piece of a parameter has the same.
struct ShardedOptimizer::Piece {
  comm::ShardPiece where;
  torch::Tensor view;  // [numel]: the parameter's elements this piece updates, in memory order
  size_t group = 0;
  int64_t step = 0;
  bool has_state = false, quantized = false;
  torch::Tensor m, v;  // FP32 [numel]: AdamW's moments; SGD's momentum buffer in m
  Quantized8 qm, qv;   // 8-bit moments (quantized)
};

namespace {

std::unique_ptr<torch::optim::OptimizerOptions> defaults_of(const TrainConfig& t) {
  if (t.optimizer == "adamw") return std::make_unique<torch::optim::AdamWOptions>(t.lr);
  return std::make_unique<torch::optim::SGDOptions>(t.lr);
}

torch::Tensor step_count(int64_t step, const torch::Device& device) {
  return torch::full({}, static_cast<double>(step), torch::TensorOptions().dtype(torch::kFloat).device(device));
}

// The parameter-shaped tensor (in the parameter's layout) holding `flat`, its memory-order
// values, on `device`.
torch::Tensor shaped_like(const torch::Tensor& param, const torch::Tensor& flat, const torch::Device& device) {
  auto out = torch::empty_like(param, param.options().device(device).requires_grad(false), torch::MemoryFormat::Preserve);
  comm::memory_order_view(out).copy_(flat);
  return out;
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(const TrainConfig& t, torch::nn::Module& model, comm::GradientSync& sync,
                                   comm::Communicator& comm, bool int8_state)
    : torch::optim::Optimizer(optimizer_groups(t, model), defaults_of(t)),
      sync_(sync),
      comm_(comm),
      adamw_(t.optimizer == "adamw"),
      int8_(int8_state) {
  std::map<const void*, size_t> group_of;
  for (size_t g = 0; g < param_groups_.size(); ++g)
    for (const auto& p : param_groups_[g].params()) group_of[p.unsafeGetTensorImpl()] = g;
  std::vector<comm::ShardPiece> where = sync_.shard_pieces();
  if (sync_.stage() == comm::ShardStage::kNone)  // every parameter whole; gradients from .grad
    for (auto& p : model.parameters()) where.push_back({p, 0, p.numel(), {}, 0, 0});
  for (auto& w : where) {
    auto piece = std::make_unique<Piece>();
    piece->view = comm::memory_order_view(w.param).narrow(0, w.offset, w.numel);
    piece->group = group_of.at(w.param.unsafeGetTensorImpl());
    piece->where = std::move(w);
    pieces_.push_back(std::move(piece));
  }
}

ShardedOptimizer::~ShardedOptimizer() = default;

torch::Tensor ShardedOptimizer::step(LossClosure closure) {
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode enable(true);
    loss = closure();
  }
  step_scaled({});
  return loss;
}

torch::Tensor ShardedOptimizer::piece_grad(const Piece& p) const {
  if (p.where.grad.defined()) return p.where.grad;
  const auto& g = p.where.param.grad();
  if (!g.defined()) return {};
  // Unsharded: the gradient in the parameter's memory order (autograd and the buckets lay it
  // out as the parameter; anything else is copied into that layout first).
  if (g.strides() == p.where.param.strides() && g.is_non_overlapping_and_dense())
    return comm::memory_order_view(g).narrow(0, p.where.offset, p.where.numel);
  // (Copied by shape, element for element: a row-major flattening of g would put channels-last
  // weights' gradients at other weights' places.)
  auto laid = torch::empty_like(p.where.param, p.where.param.options().requires_grad(false), torch::MemoryFormat::Preserve);
  laid.copy_(g);
  return comm::memory_order_view(laid).narrow(0, p.where.offset, p.where.numel);
}

std::vector<torch::Tensor> ShardedOptimizer::update_gradients(const std::vector<torch::Tensor>& params) const {
  if (!sharded()) return ScaledStep::update_gradients(params);
  std::vector<torch::Tensor> grads;
  for (const auto& p : pieces_) grads.push_back(p->where.grad);
  return grads;
}

void ShardedOptimizer::step_scaled(const torch::Tensor& grad_scale) {
  torch::NoGradGuard no_grad;
  std::optional<at::Tensor> scale;
  if (grad_scale.defined()) scale = grad_scale;
  // The FP32 pieces go through one fused call per (group, step count, first step); the 8-bit
  // ones through adamw_step_8bit each.
  struct Batch {
    std::vector<torch::Tensor> params, grads, m, v;
  };
  std::map<std::tuple<size_t, int64_t, bool>, Batch> batches;
  // Runs and drops the batches gathered so far.
  auto flush = [&] {
    for (auto& [key, b] : batches) {
      const auto& [group, step, first] = key;
      auto& o = param_groups_[group].options();
      if (adamw_) {
        const auto& a = static_cast<torch::optim::AdamWOptions&>(o);
        const auto count = step_count(step, b.params.front().device());
        std::vector<torch::Tensor> steps(b.params.size(), count);
        at::_fused_adamw_(b.params, b.grads, b.m, b.v, /*max_exp_avg_sqs=*/{}, steps, a.lr(), std::get<0>(a.betas()),
                          std::get<1>(a.betas()), a.weight_decay(), a.eps(), /*amsgrad=*/false, /*maximize=*/false,
                          scale, /*found_inf=*/std::nullopt);
      } else {
        const auto& s = static_cast<torch::optim::SGDOptions&>(o);
        at::_fused_sgd_(b.params, b.grads, b.m, s.weight_decay(), s.momentum(), s.lr(), s.dampening(), s.nesterov(),
                        /*maximize=*/false, /*is_first_step=*/first, scale, /*found_inf=*/std::nullopt);
      }
    }
    batches.clear();
  };
  size_t bucket = SIZE_MAX;  // the bucket whose converted gradients the batches hold
  for (auto& pp : pieces_) {
    Piece& p = *pp;
    auto g = piece_grad(p);
    if (!g.defined()) continue;
    if (g.scalar_type() != p.view.scalar_type()) {
      // bf16 gradient sums (memory.grad_accum_dtype): read as FP32 a bucket at a time (the
      // pieces come in bucket order), so one bucket's chunk at most is converted at once.
      if (p.where.bucket != bucket) {
        flush();
        bucket = p.where.bucket;
      }
      g = g.to(p.view.scalar_type());
    }
    auto& o = param_groups_[p.group].options();
    bool first = false;
    if (!p.has_state) {
      const auto f32 = p.view.options().dtype(torch::kFloat);
      if (adamw_) {
        p.quantized = int8_ && p.where.numel >= kMin8bitNumel;
        if (p.quantized) {
          p.qm = quantized_zeros(p.where.numel, /*is_signed=*/true, f32);
          p.qv = quantized_zeros(p.where.numel, /*is_signed=*/false, f32);
        } else {
          p.m = torch::zeros({p.where.numel}, f32);
          p.v = torch::zeros({p.where.numel}, f32);
        }
      } else if (static_cast<torch::optim::SGDOptions&>(o).momentum() != 0) {
        p.m = torch::empty({p.where.numel}, f32);
        first = true;  // the kernel's is_first_step: the buffer becomes the gradient
      }
      p.has_state = true;
    }
    ++p.step;
    if (adamw_ && p.quantized) {
      const auto& a = static_cast<torch::optim::AdamWOptions&>(o);
      adamw_step_8bit(p.view, g, p.qm, p.qv, step_count(p.step, p.view.device()), a.lr(), std::get<0>(a.betas()),
                      std::get<1>(a.betas()), a.weight_decay(), a.eps(), scale);
      continue;
    }
    auto& b = batches[{p.group, adamw_ ? p.step : 0, first}];
    b.params.push_back(p.view);
    b.grads.push_back(g);
    if (p.m.defined()) b.m.push_back(p.m);
    if (p.v.defined()) b.v.push_back(p.v);
  }
  flush();
  sync_.allgather_params(comm_);  // sharded: every rank's updated pieces to every rank
}

int64_t ShardedOptimizer::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& p : pieces_) {
    for (const auto* t : {&p->m, &p->v})
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
    if (p->quantized) bytes += p->qm.nbytes() + p->qv.nbytes();
  }
  return bytes;
}

bool ShardedOptimizer::has_state() const {
  for (const auto& p : pieces_)
    if (p->has_state) return true;
  return false;
}

std::vector<NamedTensor> ShardedOptimizer::full_state(const std::vector<std::pair<std::string, torch::Tensor>>& named,
                                                      int root) {
  torch::NoGradGuard no_grad;
  // Every rank decides alike (the same steps ran everywhere): nothing to write before the
  // first update, and SGD without momentum keeps no state.
  const bool any = has_state();
  std::vector<std::string> keys;
  if (adamw_) keys = {"exp_avg", "exp_avg_sq"};
  else keys = {"momentum_buffer"};
  // The FP32 values of state `k` of piece p (dequantised) in host memory, or undefined: the
  // full state is built on the host, a piece at a time on the device.
  auto value = [&](const Piece& p, size_t k) -> torch::Tensor {
    if (p.quantized) return dequantize8(k == 0 ? p.qm : p.qv).cpu();
    const auto& t = k == 0 ? p.m : p.v;
    return t.defined() ? t.cpu() : torch::Tensor();
  };
  std::map<const void*, size_t> index;
  for (size_t i = 0; i < named.size(); ++i) index[named[i].second.unsafeGetTensorImpl()] = i;
  std::vector<int64_t> steps(named.size(), -1);
  for (const auto& p : pieces_)
    if (p->has_state) steps[index.at(p->where.param.unsafeGetTensorImpl())] = p->step;
  std::vector<NamedTensor> out;
  std::vector<std::vector<torch::Tensor>> per_key(keys.size());
  bool stateful = any;
  if (sharded()) {
    // Whether anyone has state: the same on every rank, but a rank's pieces may be empty.
    auto flag = torch::full({1}, any ? 1.0 : 0.0, torch::TensorOptions().dtype(torch::kDouble));
    comm_.allreduce_sum(flag);
    stateful = flag.item<double>() > 0;
    if (!stateful) return out;
    for (size_t k = 0; k < keys.size(); ++k) {
      auto chunks = sync_.chunk_buffers(torch::TensorOptions().dtype(torch::kFloat));  // host: over MPI
      for (const auto& p : pieces_) {
        const auto v = value(*p, k);
        if (v.defined()) chunks[p->where.bucket].narrow(0, p->where.chunk_offset, p->where.numel).copy_(v);
      }
      per_key[k] = sync_.gather_chunks(chunks, comm_, root);
    }
    // Step counts: a parameter's pieces all have the same; a rank without a piece of it says -1.
    const auto most = torch::stack(comm_.allgather(torch::tensor(steps, torch::kLong))).amax(0);
    for (size_t i = 0; i < steps.size(); ++i) steps[i] = most[static_cast<int64_t>(i)].item<int64_t>();
    if (comm_.rank() != root) return {};
  } else {
    if (!stateful) return out;
    for (size_t k = 0; k < keys.size(); ++k) {
      per_key[k].resize(named.size());
      for (const auto& p : pieces_) per_key[k][index.at(p->where.param.unsafeGetTensorImpl())] = value(*p, k);
    }
  }
  for (size_t i = 0; i < named.size(); ++i) {
    if (steps[i] < 0) continue;  // no update reached this parameter
    const auto& [name, param] = named[i];
    if (adamw_) out.push_back({name + "/step", torch::full({}, steps[i], torch::TensorOptions().dtype(torch::kLong))});
    for (size_t k = 0; k < keys.size(); ++k)
      if (per_key[k][i].defined())
        out.push_back({name + "/" + keys[k], shaped_like(param, per_key[k][i], torch::kCPU).contiguous()});
  }
  return out;
}

void ShardedOptimizer::load_full_state(
    const std::vector<std::pair<std::string, torch::Tensor>>& named,
    const std::function<const torch::Tensor*(const std::string&, const std::string&)>& find) {
  torch::NoGradGuard no_grad;
  std::map<const void*, std::string> name_of;
  for (const auto& [n, t] : named) name_of[t.unsafeGetTensorImpl()] = n;
  for (auto& pp : pieces_) {
    Piece& p = *pp;
    const auto& param = p.where.param;
    const std::string& name = name_of.at(param.unsafeGetTensorImpl());
    p = Piece{p.where, p.view, p.group};  // fresh unless the checkpoint has state for it
    auto slice = [&](const std::string& key) -> torch::Tensor {
      const torch::Tensor* full = find(name, key);
      if (!full) throw CheckpointError("optimizer state " + name + "/" + key + " is missing");
      if (full->sizes() != param.sizes()) throw CheckpointError("optimizer state " + name + "/" + key + " has the wrong shape");
      auto laid = torch::empty_like(param, param.options().device(torch::kCPU).requires_grad(false),
                                    torch::MemoryFormat::Preserve);
      laid.copy_(*full);
      return comm::memory_order_view(laid).narrow(0, p.where.offset, p.where.numel).to(param.device(), /*non_blocking=*/false,
                                                                                       /*copy=*/true);
    };
    if (adamw_) {
      const torch::Tensor* step = find(name, "step");
      if (!step) continue;
      p.step = step->item<int64_t>();
      p.quantized = int8_ && p.where.numel >= kMin8bitNumel;
      auto m = slice("exp_avg"), v = slice("exp_avg_sq");
      if (p.quantized) {
        p.qm = quantize8(m, /*is_signed=*/true);
        p.qv = quantize8(v, /*is_signed=*/false);
      } else {
        p.m = m;
        p.v = v;
      }
      p.has_state = true;
    } else {
      if (!find(name, "momentum_buffer")) continue;
      p.m = slice("momentum_buffer");
      p.has_state = true;
    }
  }
}

std::unique_ptr<torch::optim::Optimizer> make_run_optimizer(const Config& cfg, torch::nn::Module& model,
                                                            comm::GradientSync& sync, comm::Communicator& comm) {
  const bool int8 = cfg.memory.optimizer_state == "int8";
  if (sync.stage() == comm::ShardStage::kNone && !int8) return make_optimizer(cfg.train, model);
  return std::make_unique<ShardedOptimizer>(cfg.train, model, sync, comm, int8);
}

}  // namespace lt::optim
