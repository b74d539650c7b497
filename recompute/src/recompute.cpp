#include "leantrain/recompute/recompute.h"

#include "leantrain/recompute/conv_products.h"
#include "leantrain/recompute/lm_loss.h"

#include <ATen/autocast_mode.h>
#include <ATen/Context.h>

#include <optional>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/torch.h>

#include "leantrain/runtime/errors.h"

namespace lt::recompute {
namespace {

// Note [Activation recompute]
// forward() runs fn with grad disabled (inside a custom Function), so no activation is kept;
// it saves the inputs, the RNG states of the CPU and every initialised CUDA generator, and
// the autocast state. backward() restores those, reruns fn with grad enabled on detached
// copies of the inputs, and differentiates the rerun with the caller's autocast state back in
// place (Note [Rerun gradients]) — never torch::autograd::backward() inside backward, which
// misbehaved under autocast. The caller's RNG state and autocast state are put back
// afterwards, and module buffers (BatchNorm running stats, updated by the rerun) are restored
// from a snapshot so the recomputation leaves no trace.
// The parameters are a TensorList argument: LibTorch's custom Function sees tensors in a
// TensorList as inputs, but not those in a std::vector argument.

// Note [Dropout masks kept as bits]
// A rerun must apply the dropout masks of the original forward. Restoring the RNG state and
// drawing them again is what torch.utils.checkpoint does; on the CPU drawing is the
// expensive part of dropout (one bernoulli_ over [8, 12, 512, 512] attention probabilities
// takes about as long as a bf16 block's matmuls with AMX), so `selective`, which reruns the
// attention core, paid for it once more per layer. Instead, lt::recompute::dropout inside a
// recomputed function keeps its mask as one bit per element (3 MiB for those probabilities,
// against 96 MiB for the fp32 mask that plain dropout saves) on the recomputed function's
// tape, and the rerun multiplies by the noise those bits describe (1 / (1 - p) where the draw
// was 1, else 0) in one pass without making it (masked_scale), as torch::dropout multiplies
// after its draw: the output is bitwise the same. The rerun's backward does the same to the
// gradient, as the product's backward (grad * noise) does, so the rerun's graph keeps the
// bits instead of the noise (3 MiB instead of 96 MiB per fp32 attention dropout).
// Nesting: the masks come from the innermost recomputed function that is replaying, else from
// the RNG; every recording one on the stack records them, so a recomputed function that runs
// inside another's rerun replays what that rerun used. Only the CPU: on CUDA, torch::dropout runs a
// fused kernel (native_dropout) with its own draws, and drawing is cheap there.
// A random op other than lt::recompute::dropout inside a recomputed function still draws from
// the restored RNG in the rerun; after a replayed dropout (which draws nothing) it would see
// another part of the stream, so such functions must not mix the two (none of ours do).
struct DropoutTape {
  std::vector<at::Tensor> bits;
  size_t next = 0;
  bool replay = false;
};

std::vector<DropoutTape*>& dropout_tapes() {
  thread_local std::vector<DropoutTape*> tapes;
  return tapes;
}

struct TapeScope {
  explicit TapeScope(DropoutTape* t) { dropout_tapes().push_back(t); }
  ~TapeScope() { dropout_tapes().pop_back(); }
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;
};

// Turns autocast's cast cache off for a scope and puts the previous setting back.
struct CastCacheOff {
  const bool before = at::autocast::is_autocast_cache_enabled();
  CastCacheOff() { at::autocast::set_autocast_cache_enabled(false); }
  ~CastCacheOff() { at::autocast::set_autocast_cache_enabled(before); }
  CastCacheOff(const CastCacheOff&) = delete;
  CastCacheOff& operator=(const CastCacheOff&) = delete;
};

struct Recompute : torch::CustomClassHolder {
  RecomputeFn fn;
  RecomputeFn rerun;  // what backward runs instead of fn, when set (in_backward)
  std::vector<torch::nn::Module*> buffers_of;
  size_t n_inputs = 0, n_params = 0;
  // A packed input (Note [Packed block inputs]): handed to forward here, then saved there.
  std::optional<PackedTensor> pack;
  bool packed = false;
  bool packed_requires_grad = false;
  // With a pack: the convolution fn's input goes through first (fn gets its output).
  torch::nn::Conv2dImpl* first_conv = nullptr;
  HeadMatmul conv_products = HeadMatmul::kAutocast;  // first_conv's (conv_products.h)
  // The BatchNorm fn's output goes through, and the batch statistics it used (Note [A unit's
  // last BatchNorm is not rerun]; undefined where it was not recorded).
  torch::nn::BatchNorm2dImpl* last_bn = nullptr;
  at::Tensor bn_mean, bn_invstd;
  // Its parameters are read by other recomputed functions too: return their gradients
  // (Note [Rerun gradients]).
  bool shared_params = false;
  at::Tensor cpu_rng;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda_rng;
  bool ac_cpu = false, ac_cuda = false;
  at::ScalarType ac_cpu_dtype = at::kBFloat16, ac_cuda_dtype = at::kHalf;
  DropoutTape tape;  // Note [Dropout masks kept as bits]
};

struct AutocastState {
  bool cpu, cuda;
  at::ScalarType cpu_dtype, cuda_dtype;
  static AutocastState now() {
    return {at::autocast::is_autocast_enabled(at::kCPU), at::autocast::is_autocast_enabled(at::kCUDA),
            at::autocast::get_autocast_dtype(at::kCPU), at::autocast::get_autocast_dtype(at::kCUDA)};
  }
  void apply() const {
    at::autocast::set_autocast_dtype(at::kCPU, cpu_dtype);
    at::autocast::set_autocast_dtype(at::kCUDA, cuda_dtype);
    at::autocast::set_autocast_enabled(at::kCPU, cpu);
    at::autocast::set_autocast_enabled(at::kCUDA, cuda);
  }
};

// Generators are handles: a copy shares the state of the default one (the getters return const&).
at::Generator cpu_generator() { return at::detail::getDefaultCPUGenerator(); }
at::Generator cuda_generator(c10::DeviceIndex d) {
  return at::globalContext().defaultGenerator(c10::Device(c10::kCUDA, d));
}

int cuda_generators() {
  return at::globalContext().hasCUDA() ? static_cast<int>(at::detail::getCUDAHooks().deviceCount()) : 0;
}

void restore_buffers(const Recompute& rc, const std::vector<at::Tensor>& snapshot) {
  torch::NoGradGuard ng;
  size_t i = 0;
  for (auto* m : rc.buffers_of)
    for (auto& b : m->buffers()) b.copy_(snapshot[i++]);
}

// Note [Rerun gradients]
// The rerun's graph is differentiated by the engine directly (as autograd::grad does, minus
// its hold on the output): a rerun's output is rarely saved by its own graph (a BatchNorm's or
// a residual sum's is not), so it need not live while the graph is differentiated — in a
// ResNet-50 bottleneck at 56x56 that is 24.5 MiB.
// Each input the rerun reads is a fresh tensor whose gradient edge ends in a GradSink, which
// keeps the gradient as it arrives (no leaf accumulation, so no layout change or copy).
// Parameters: when the backward that runs this one is a plain backward() (its graph task
// has no exec_info: it runs every node and accumulates into every leaf), the rerun
// accumulates into each parameter's .grad as soon as its gradient is computed, as the
// plain graph does, and RecomputeFunction returns no gradient for them; otherwise
// (autograd::grad, backward(inputs=...), or a rerun nested in another rerun) the gradients
// are captured and returned, so the caller's graph routes them. Returning them held a
// unit's weight gradients until its whole rerun was differentiated: in ResNet-50's stage 4
// first block, 13 MiB (conv2's and conv3's) during conv1's backward, which was the peak of
// `full`. A parameter read by several recomputed functions (the LM head in
// chunked_lm_loss) is always returned: summed by the caller's graph first, it is added to
// .grad once, in the order the plain graph adds it.
struct GradSink : torch::autograd::Node {
  at::Tensor grad;
  torch::autograd::variable_list apply(torch::autograd::variable_list&& g) override {
    if (!g.empty()) grad = std::move(g[0]);
    return {};
  }
};

bool outer_backward_accumulates() {
  const auto* exec_info = torch::autograd::get_current_graph_task_exec_info();
  return exec_info != nullptr && exec_info->empty();
}

// Differentiates `out` (released first) with gradient `grad`. Returns the gradients of the
// sinks' inputs and, unless `in_place`, of `params`; with `in_place` the parameters'
// gradients are added to their .grad and their slots are undefined.
torch::autograd::variable_list differentiate_rerun(at::Tensor out, const at::Tensor& grad,
                                                   const std::vector<std::shared_ptr<GradSink>>& sinks,
                                                   const std::vector<at::Tensor>& params, bool in_place) {
  torch::autograd::edge_list roots{torch::autograd::impl::gradient_edge(out)};
  out.reset();
  torch::autograd::edge_list wanted;
  for (const auto& s : sinks) wanted.emplace_back(s, 0);
  for (const auto& t : params) {
    auto fn = torch::autograd::impl::try_get_grad_accumulator(t);
    if (fn) {
      wanted.emplace_back(std::move(fn), 0);
    } else {
      wanted.emplace_back(std::make_shared<torch::autograd::Identity>(), 0);  // not in the graph: unused
    }
  }
  auto got = torch::autograd::Engine::get_default_engine().execute(roots, {grad}, /*keep_graph=*/false,
                                                                   /*create_graph=*/false, in_place, wanted);
  if (!in_place) return got;
  torch::autograd::variable_list grads(sinks.size() + params.size());
  for (size_t i = 0; i < sinks.size(); ++i) grads[i] = std::move(sinks[i]->grad);
  return grads;
}

// Note [A unit's last BatchNorm is not rerun]
// A ResNet unit ends with a BatchNorm (bn3 of a bottleneck's branch, the shortcut's bn), and
// nothing in the unit's backward reads that BatchNorm's output: its backward needs its
// input, weight and batch statistics, and the unit's output is let go before the rerun is
// differentiated (Note [Rerun gradients]). The rerun computed it anyway, with the statistics
// pass before it: those BatchNorms are the widest of a bottleneck (4x the channels of bn1
// and bn2). So on the CPU the first forward runs that BatchNorm as the module does
// (at::native_batch_norm, which at::batch_norm calls there, with the module's momentum and
// num_batches_tracked), keeps the two per-channel statistics it returns, and the rerun ends
// with a node that holds the BatchNorm's input and those statistics and whose backward is
// at::native_batch_norm_backward with them, the call autograd's NativeBatchNormBackward0
// makes: bitwise the same gradients, no output and no statistics pass in the rerun. Its
// "output" is a one-element stand-in of the output's sizes. On CUDA (cuDNN's BatchNorm has a
// backward of its own) and outside training with running statistics, the module runs as is.

at::Tensor batch_norm_keeping_stats(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x, at::Tensor& mean,
                                    at::Tensor& invstd) {
  mean.reset();
  invstd.reset();
  const auto& o = bn.options;
  if (!x.device().is_cpu() || !bn.is_training() || !o.track_running_stats() || !bn.num_batches_tracked.defined() ||
      x.dim() != 4 || x.size(0) * x.size(2) * x.size(3) == 1)
    return bn.forward(x);  // including the module's errors for a wrong input
  const double factor = count_batch(bn);
  auto [out, m, s] = at::native_batch_norm(x, bn.weight, bn.bias, bn.running_mean, bn.running_var,
                                           /*training=*/true, factor, o.eps());
  mean = m;
  invstd = s;
  return out;
}

class BatchNormTail : public torch::autograd::Function<BatchNormTail> {
 public:
  // params: the weight and bias where the BatchNorm is affine.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                at::TensorList params, at::Tensor mean, at::Tensor invstd, double eps) {
    std::vector<at::Tensor> saved{x, mean, invstd};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["eps"] = eps;
    return {at::empty_strided(x.sizes(), std::vector<int64_t>(x.dim(), 0), x.options())};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const bool affine = saved.size() > 3;
    const at::Tensor weight = affine ? saved[3] : at::Tensor();
    auto [gx, gw, gb] = at::native_batch_norm_backward(
        grad_out[0], saved[0], weight, at::Tensor(), at::Tensor(), saved[1], saved[2], /*train=*/true,
        ctx->saved_data["eps"].toDouble(),
        {ctx->needs_input_grad(0), affine && ctx->needs_input_grad(1), affine && ctx->needs_input_grad(2)});
    torch::autograd::variable_list grads{gx};
    if (affine) {
      grads.push_back(gw);
      grads.push_back(gb);
    }
    grads.resize(grads.size() + 3);  // mean, invstd, eps
    return grads;
  }
};

at::Tensor batch_norm_tail(torch::nn::BatchNorm2dImpl& bn, const at::Tensor& x, const at::Tensor& mean,
                           const at::Tensor& invstd) {
  std::vector<at::Tensor> params;
  if (bn.options.affine()) params = {bn.weight, bn.bias};
  return BatchNormTail::apply(x, at::TensorList(params), mean, invstd, bn.options.eps())[0];
}

class RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs, at::TensorList params,
                                                c10::intrusive_ptr<Recompute> rc) {
    rc->n_inputs = inputs.size();
    rc->n_params = params.size();
    rc->cpu_rng = cpu_generator().get_state();
    for (int d = 0; d < cuda_generators(); ++d) {
      const auto idx = static_cast<c10::DeviceIndex>(d);
      rc->cuda_rng.emplace_back(idx, cuda_generator(idx).get_state());
    }
    const auto ac = AutocastState::now();
    rc->ac_cpu = ac.cpu;
    rc->ac_cuda = ac.cuda;
    rc->ac_cpu_dtype = ac.cpu_dtype;
    rc->ac_cuda_dtype = ac.cuda_dtype;
    std::vector<at::Tensor> in(inputs.begin(), inputs.end());
    at::Tensor out;
    {
      // Autocast's cast cache would keep a low-precision copy of every weight fn reads until
      // the outermost autocast region ends, though nothing here saves them: the rerun casts
      // again, and one forward reads each weight once.
      CastCacheOff no_cache;
      TapeScope tape(&rc->tape);
      out = rc->first_conv ? rc->fn({lt::recompute::conv2d(*rc->first_conv, in[0], rc->conv_products)}) : rc->fn(in);
      if (rc->last_bn) out = batch_norm_keeping_stats(*rc->last_bn, out, rc->bn_mean, rc->bn_invstd);
    }
    std::vector<at::Tensor> to_save;
    if (rc->pack) {
      TORCH_CHECK(inputs.size() == 1, "recompute: a packed unit has one input");
      rc->packed = true;
      rc->packed_requires_grad = inputs[0].requires_grad();
    } else {
      to_save.assign(inputs.begin(), inputs.end());
    }
    to_save.insert(to_save.end(), params.begin(), params.end());
    ctx->save_for_backward(to_save);
    ctx->saved_data["recompute"] = c10::IValue::make_capsule(rc);
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_out) {
    auto rc = c10::static_intrusive_pointer_cast<Recompute>(ctx->saved_data["recompute"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    std::vector<at::Tensor> inputs, params;
    std::vector<std::shared_ptr<GradSink>> sinks;
    std::vector<size_t> target_slot;  // position in the returned gradient list: sinks, then params
    const bool packed = rc->packed;
    const size_t first_param = packed ? 0 : rc->n_inputs;  // in `saved`
    if (packed)
      TORCH_CHECK(rc->pack, "recompute: a unit with a packed input was differentiated twice (its input is "
                            "released by the first backward)");
    for (size_t i = 0; i < rc->n_inputs; ++i) {
      // A packed input is read only by the unit's first convolution, which unpacks it itself
      // (Note [Packed input kept through the rerun]): the rerun gets a one-element stand-in
      // with its sizes and dtype, which carries the gradient edge.
      auto x = packed ? at::empty_strided(rc->pack->sizes, std::vector<int64_t>(rc->pack->sizes.size(), 0),
                                          rc->pack->values.options())
                      : saved[i].detach();
      if (packed ? rc->packed_requires_grad : saved[i].requires_grad()) {
        sinks.push_back(std::make_shared<GradSink>());
        torch::autograd::set_history(x, sinks.back());  // Note [Rerun gradients]
        target_slot.push_back(i);
      }
      inputs.push_back(x);
    }
    for (size_t i = first_param; i < saved.size(); ++i)
      if (saved[i].requires_grad()) {
        params.push_back(saved[i]);
        target_slot.push_back(rc->n_inputs + (i - first_param));
      }
    // Snapshot what the rerun disturbs: RNG, autocast state, buffers.
    const auto cpu_rng_now = cpu_generator().get_state();
    std::vector<at::Tensor> cuda_rng_now;
    for (auto& [d, st] : rc->cuda_rng) {
      auto gen = cuda_generator(d);
      cuda_rng_now.push_back(gen.get_state());
      gen.set_state(st);
    }
    cpu_generator().set_state(rc->cpu_rng);
    const auto ac_now = AutocastState::now();
    AutocastState{rc->ac_cpu, rc->ac_cuda, rc->ac_cpu_dtype, rc->ac_cuda_dtype}.apply();
    std::vector<at::Tensor> buffers;
    for (auto* m : rc->buffers_of)
      for (auto& b : m->buffers()) buffers.push_back(b.clone());

    at::Tensor out;
    {
      torch::AutoGradMode grad_on(true);
      // The rerun is an autocast region of its own, as torch.autocast makes it in
      // torch.utils.checkpoint: leaving it at nesting 0 clears the cast cache, which would
      // otherwise keep a low-precision copy of the block's weights alive until the next
      // forward ends (the rerun's graph holds the casts it needs).
      const bool autocast = rc->ac_cpu || rc->ac_cuda;
      if (autocast) at::autocast::increment_nesting();
      try {
        rc->tape.replay = true;
        rc->tape.next = 0;
        TapeScope tape(&rc->tape);
        out = packed ? rc->fn({conv_keeping_packed_input(
                                *rc->first_conv, inputs[0], *rc->pack,
                                conv_products_in_fp32(rc->conv_products, inputs[0].device().type()))})
                          : (rc->rerun ? rc->rerun : rc->fn)(inputs);
        if (rc->last_bn)
          out = rc->bn_mean.defined() ? batch_norm_tail(*rc->last_bn, out, rc->bn_mean, rc->bn_invstd)
                                      : rc->last_bn->forward(out);
        TORCH_CHECK(rc->tape.next == rc->tape.bits.size(), "recompute: the rerun applied ", rc->tape.next,
                    " dropout masks, its forward drew ", rc->tape.bits.size(),
                    " (a recomputed function must take the same path twice)");
      } catch (...) {
        // An error in the rerun (out of memory under a budget, which the trainer recovers
        // from) leaves the caller's autocast, RNG and buffers as they were.
        if (autocast && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
        ac_now.apply();
        cpu_generator().set_state(cpu_rng_now);
        for (size_t i = 0; i < rc->cuda_rng.size(); ++i)
          cuda_generator(rc->cuda_rng[i].first).set_state(cuda_rng_now[i]);
        restore_buffers(*rc, buffers);
        throw;
      }
      if (autocast && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    }
    rc->tape.bits.clear();  // the rerun's graph holds the noise it built from them
    // This unit's hold on its packed input ends here: its first convolution holds it for its
    // own backward (the last unit sharing it frees it).
    rc->pack.reset();
    inputs.clear();
    ac_now.apply();
    cpu_generator().set_state(cpu_rng_now);
    for (size_t i = 0; i < rc->cuda_rng.size(); ++i)
      cuda_generator(rc->cuda_rng[i].first).set_state(cuda_rng_now[i]);

    torch::autograd::variable_list grads(rc->n_inputs + rc->n_params + 1);  // + the Recompute argument
    if (!target_slot.empty() && out.requires_grad()) {
      const bool in_place = !rc->shared_params && outer_backward_accumulates();
      auto g = differentiate_rerun(std::move(out), grad_out[0], sinks, params, in_place);
      for (size_t i = 0; i < g.size(); ++i) grads[target_slot[i]] = std::move(g[i]);
    }
    // After the rerun's graph is consumed: BatchNorm saved its running stats as inputs, so
    // restoring them earlier would trip autograd's version check.
    restore_buffers(*rc, buffers);
    return grads;
  }
};

torch::Tensor apply_recompute_function(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                               const std::vector<torch::Tensor>& params,
                               const std::vector<torch::nn::Module*>& buffers_of, std::optional<PackedTensor> pack,
                               bool shared_params = false, const ConvUnit* unit = nullptr,
                               RecomputeFn rerun = {}) {
  if (!torch::GradMode::is_enabled())
    return unit ? unit->last->forward(fn({unit->first->forward(inputs[0])})) : fn(inputs);
  auto rc = c10::make_intrusive<Recompute>();
  rc->fn = std::move(fn);
  rc->rerun = std::move(rerun);
  if (unit) {
    rc->first_conv = unit->first;
    rc->conv_products = unit->conv_products;
    rc->last_bn = unit->last;
  }
  rc->shared_params = shared_params;
  rc->buffers_of = buffers_of;
  rc->pack = std::move(pack);
  return RecomputeFunction::apply(at::TensorList(inputs), at::TensorList(params), rc)[0];
}

}  // namespace

double count_batch(torch::nn::BatchNorm2dImpl& bn) {
  // What BatchNormImplBase::forward does before it calls F::batch_norm.
  bn.num_batches_tracked += 1;
  const auto& momentum = bn.options.momentum();
  return momentum ? *momentum : 1.0 / bn.num_batches_tracked.item<double>();
}

torch::Tensor in_backward(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params, const std::vector<torch::nn::Module*>& buffers_of,
                         RecomputeFn rerun) {
  return apply_recompute_function(std::move(fn), inputs, params, buffers_of, std::nullopt, /*shared_params=*/false,
                          /*unit=*/nullptr, std::move(rerun));
}

torch::Tensor in_backward(const ConvUnit& unit, const torch::Tensor& x, const PackedTensor& packed,
                         const std::vector<torch::Tensor>& params, const std::vector<torch::nn::Module*>& buffers_of) {
  TORCH_CHECK(unit.first && unit.last && unit.middle, "recompute: a ConvUnit needs its first convolution, its "
                                                      "middle and its last BatchNorm");
  return apply_recompute_function(unit.middle, {x}, params, buffers_of, packed, /*shared_params=*/false, &unit);
}

bool rerunning() {
  for (const auto* t : dropout_tapes())
    if (t->replay) return true;
  return false;
}

torch::Tensor dropout(const torch::Tensor& x, double p, bool train) {
  auto& tapes = dropout_tapes();
  if (tapes.empty() || !train || !(p > 0.0 && p < 1.0) || x.numel() == 0 || !x.device().is_cpu() ||
      !at::isFloatingType(x.scalar_type()))
    return torch::dropout(x, p, train);
  DropoutTape* source = nullptr;
  for (auto it = tapes.rbegin(); it != tapes.rend() && !source; ++it)
    if ((*it)->replay) source = *it;
  auto record = [&](const at::Tensor& bits) {
    for (auto* t : tapes)
      if (!t->replay) t->bits.push_back(bits);
  };
  if (source) {
    TORCH_CHECK(source->next < source->bits.size(), "recompute: the rerun applies more dropout masks than its "
                "forward drew (", source->bits.size(), ")");
    const auto bits = source->bits[source->next++];
    record(bits);
    // The noise forward made: 1 / (1 - p) where the draw was 1. ATen divides each element
    // alike (true division, in float for bf16/fp16), so one element divided is the value.
    // Forward drew into empty_like(x): x's layout where x is dense, else a contiguous one.
    const auto value = at::ones({1}, x.options()).div_(1 - p);
    return masked_scale(x.is_non_overlapping_and_dense() ? x : x.contiguous(), bits, value);
  }
  at::Tensor noise;
  {
    at::NoGradGuard no_grad;
    // What torch::dropout does on the CPU (ATen's _dropout_impl): the same draw.
    noise = at::empty_like(x);
    noise.bernoulli_(1 - p);
    record(nonzero_bits(noise));
    noise.div_(1 - p);
  }
  return x * noise;
}

torch::Tensor in_backward(RecomputeFn fn, const std::vector<torch::Tensor>& inputs,
                         const std::vector<torch::Tensor>& params, torch::nn::Module* buffers_of) {
  std::vector<torch::nn::Module*> modules;
  if (buffers_of) modules.push_back(buffers_of);
  return in_backward(std::move(fn), inputs, params, modules);
}

// Note [Chunked LM loss]
// With every block recomputed, what remains of a language model's activations is its
// head: [B,T,V] logits and cross-entropy's log-softmax of them, in fp32 — for GPT-2 at
// B=8, T=512 that is 1.6 GB, more than all recomputed blocks' inputs together. Splitting
// the tokens into chunks, each chunk's head + summed cross-entropy recomputed in backward,
// keeps one chunk's logits alive at a time in forward and in backward, for the cost of
// recomputing the head matmul once.
torch::Tensor chunked_lm_loss(const torch::Tensor& hidden, const torch::Tensor& target,
                              const std::vector<torch::Tensor>& params,
                              const std::function<torch::Tensor(const torch::Tensor&)>& head,
                              int64_t chunk_tokens) {
  auto h = hidden.reshape({-1, hidden.size(-1)});
  auto t = target.reshape({-1});
  const int64_t n = h.size(0);
  const auto count = (t != kIgnoreIndex).sum().clamp_min(1).to(torch::kFloat);
  torch::Tensor total;
  for (int64_t start = 0; start < n; start += chunk_tokens) {
    const int64_t len = std::min(chunk_tokens, n - start);
    auto tc = t.narrow(0, start, len);
    auto part = apply_recompute_function(
        [head, tc](const std::vector<torch::Tensor>& in) {
          return torch::nn::functional::cross_entropy(
              head(in[0]).to(torch::kFloat), tc,
              torch::nn::functional::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
        },
        {h.narrow(0, start, len)}, params, {}, std::nullopt, /*shared_params=*/true);
    total = total.defined() ? total + part : part;
  }
  return total / count;
}

RecomputePolicy RecomputePolicy::parse(const std::string& text) {
  RecomputePolicy p;
  if (text == "none") return p;
  if (text == "full") {
    p.kind = Kind::kFull;
  } else if (text == "selective") {
    p.kind = Kind::kSelective;
  } else if (text.rfind("every:", 0) == 0 && text.size() > 6 &&
             text.find_first_not_of("0123456789", 6) == std::string::npos && std::stoll(text.substr(6)) > 0) {
    p.kind = Kind::kEvery;
    p.every = std::stoll(text.substr(6));
  } else {
    throw ConfigError("memory.recompute = '" + text +
                      "': allowed: none | full | every:K | selective (auto is resolved by the planner: "
                      "train --auto --memory-budget SIZE, or the --set lines of leantrain plan)");
  }
  return p;
}

// Note [The last block is not recomputed]
// Backward starts with the last block: recomputing it would drop its activations at the
// end of forward only to rebuild them at once, after the head's backward — one block's
// forward spent for nothing, since the peak that recompute lowers is where one block's
// activations are held on top of every recomputed unit's input, which that rerun reaches anyway.
// So `full` and `every:K` keep the last block (as torch.utils.checkpoint_sequential runs its
// last segment plainly): GPT-2 6 layers saves a sixth of the blocks' recompute (~2 % of a
// step); ResNet's units (resnet.cpp) do the same. The held activations then overlap the
// head's forward and backward instead of following them: under the fused LM loss that is
// its chunk's transients (~3 x 64 MiB), within what the rerun held next to the head's
// gradients before. A model of one block recomputes nothing under `full`.
bool RecomputePolicy::recomputes_block(size_t index, size_t count) const {
  if (index + 1 >= count) return false;
  switch (kind) {
    case Kind::kNone: return false;
    case Kind::kFull: return true;
    case Kind::kEvery: return index % static_cast<size_t>(every) == 0;
    case Kind::kSelective: return false;  // only the regions marked cheap
  }
  return false;
}

std::string RecomputePolicy::to_string() const {
  switch (kind) {
    case Kind::kNone: return "none";
    case Kind::kFull: return "full";
    case Kind::kEvery: return "every:" + std::to_string(every);
    case Kind::kSelective: return "selective";
  }
  return "none";
}

}  // namespace lt::recompute
