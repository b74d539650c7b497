#include "leantrain/comm/grad_sync.h"

#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "leantrain/comm/buckets.h"

namespace lt::comm {
namespace {

// Note [Gradient-ready hooks]
// A parameter's gradient is final for a backward when its AccumulateGrad node has run: the
// engine sums every gradient flowing into a leaf in the node's input buffer and runs the
// node once, after all of them arrived, and the node's post hooks run right after it has
// added into .grad. So a post hook on torch::autograd::impl::grad_accumulator(param) — what
// c10d's Reducer uses — fires exactly once per parameter per backward, with .grad final:
//  - a parameter used twice (GPT's tied embedding and head, the chunked LM loss) has one
//    AccumulateGrad with several incoming edges: one run, after the last of them;
//  - under activation checkpointing (recompute/src/recompute.cpp, Note [Rerun
//    gradients]) a plain backward's rerun runs the parameters' AccumulateGrad nodes itself,
//    each once, with the gradient, as soon as it is computed; the checkpoint Function then
//    hands the outer backward no gradient for them, and the outer backward runs the same
//    nodes once more with none, which adds nothing to .grad: the hook ignores a run whose
//    input is undefined. (Under autograd::grad the rerun captures the gradients instead and
//    the outer backward's run is the one with them.) A parameter read by several
//    checkpointed functions (the LM head's chunks) is always returned to the outer backward,
//    whose one AccumulateGrad run sums them.
// The unit tests check both counts (tests/unit/test_comm.cpp). A second firing within one
// synchronisation would mean the gradient was not final when the bucket was packed: it is
// an error, not silently wrong sums.
// A parameter keeps only a weak reference to its AccumulateGrad (the graph holds it while
// one exists); GradientSync holds it so the node, with its hook, survives between steps.
// The hooks are inert until begin_last_backward() arms them, so earlier micro-batches and
// evaluation communicate nothing. Buckets start in bucket order only (a ready bucket waits
// for the ones before it), so every rank issues the same all-reduces in the same order even
// if its gradients arrive in another order or some parameter gets no gradient this step
// (those are marked ready in finish(), with zeros). Open MPI progresses a non-blocking
// collective only inside MPI calls: every hook test()s the oldest all-reduce in flight,
// which drives all of them.
class CallbackPostHook final : public torch::autograd::FunctionPostHook {
 public:
  explicit CallbackPostHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& inputs) override {
    // A run without a gradient added nothing to .grad (see the Note).
    if (!inputs.empty() && inputs[0].defined()) fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// Note [Gradients in the parameter's layout]
// A slot holds its gradient in the parameter's memory order, not in row-major order: a
// channels-last convolution weight's gradient is channels-last in its slot too, as autograd
// makes it (the gradient layout contract) and as c10d lays out its bucket views. The fused
// optimizers (at::_fused_sgd_, at::_fused_adamw_) walk a parameter and its gradient element by
// element in memory, so a gradient in another layout than its parameter would update each
// weight with another weight's gradient: before this, ResNet (channels-last by default) at 2
// ranks trained on scrambled convolution gradients (the peer bench's losses differed by 0.18 %
// from step 2 while 1 rank matched; tested by GradSync.ChannelsLastGradientsKeepTheirLayout).
// Parameters that are not dense get the row-major layout.
torch::Tensor slot_view(const torch::Tensor& slot, const torch::Tensor& p) {
  return p.is_non_overlapping_and_dense() ? slot.as_strided(p.sizes(), p.strides()) : slot.view(p.sizes());
}

// Whether gradient g is exactly bucket slot `slot` of parameter p (same memory, p's layout,
// same length).
bool is_slot(const torch::Tensor& g, const torch::Tensor& slot, const torch::Tensor& p) {
  return g.data_ptr() == slot.data_ptr() && g.sizes() == p.sizes() && g.strides() == slot_view(slot, p).strides() &&
         g.scalar_type() == slot.scalar_type();
}

// A tensor shaped as p on the memory of contiguous `slot`, in p's layout, sharing its storage
// but not an autograd view of it (Note [Gradients as bucket views]).
torch::Tensor alias(const torch::Tensor& slot, const torch::Tensor& p) {
  torch::NoGradGuard no_grad;
  const auto shaped = slot_view(slot, p);
  auto t = torch::empty({0}, slot.options());
  t.set_(slot.storage(), shaped.storage_offset(), shaped.sizes(), shaped.strides());
  return t;
}

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

GradientSync::GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb,
                           bool overlap)
    : overlap_(overlap) {
  // Gradients become final roughly in reverse parameter order during backward.
  params_.assign(params.rbegin(), params.rend());
  std::vector<BucketTensor> sizes;
  for (const auto& p : params_)
    sizes.push_back({static_cast<int64_t>(p.numel() * p.element_size()), static_cast<int>(p.scalar_type())});
  const auto assignment = assign_buckets(sizes, static_cast<int64_t>(first_bucket_mb * 1048576.0),
                                         static_cast<int64_t>(bucket_mb * 1048576.0));
  bucket_of_.resize(params_.size());
  ready_.assign(params_.size(), 0);
  for (const auto& members : assignment) {
    Bucket b;
    b.members = members;
    for (size_t i : members) {
      bucket_of_[i] = buckets_.size();
      b.offsets.push_back(b.numel);
      b.numel += params_[i].numel();
    }
    b.pending = members.size();
    buckets_.push_back(std::move(b));
  }
}

GradientSync::~GradientSync() {
  // The nodes may outlive us (a graph still referring to them): take our hooks off.
  for (size_t i = 0; i < accumulators_.size(); ++i) accumulators_[i]->del_post_hook(hook_keys_[i]);
}

void GradientSync::allocate_buffers() {
  if (buffer_bytes_ > 0 || buckets_.empty()) return;
  for (auto& b : buckets_) {
    const auto& first = params_[b.members.front()];
    b.flat = torch::empty({b.numel}, first.options().requires_grad(false));
    buffer_bytes_ += static_cast<int64_t>(b.flat.nbytes());
  }
}

bool GradientSync::in_buckets(const torch::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return false;
  for (const auto& b : buckets_)
    if (b.flat.defined() && t.storage().is_alias_of(b.flat.storage())) return true;
  return false;
}

void GradientSync::install_hooks() {
  if (!accumulators_.empty()) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].requires_grad()) continue;  // never gets a gradient: marked ready in finish()
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) continue;  // not a leaf: no AccumulateGrad; marked ready in finish()
    hook_keys_.push_back(acc->add_post_hook(std::make_unique<CallbackPostHook>([this, i] { mark_ready(i); })));
    accumulators_.push_back(std::move(acc));
  }
}

void GradientSync::begin_last_backward(Communicator& comm) { begin(comm, overlap_); }

void GradientSync::begin(Communicator& comm, bool hooks) {
  if (armed_)
    throw std::logic_error("GradientSync::begin_last_backward called twice without finish() (rank " +
                           std::to_string(comm.rank()) + ")");
  allocate_buffers();
  if (hooks) install_hooks();
  comm_ = &comm;
  armed_ = true;
  in_backward_ = hooks;
  times_ = GradSyncTimes{};
}

void GradientSync::mark_ready(size_t param) {
  if (!in_backward_) return;
  if (ready_[param])
    throw std::logic_error("GradientSync: the gradient-ready hook of parameter " + std::to_string(param) +
                           " (reverse order) fired twice in one backward on rank " + std::to_string(comm_->rank()) +
                           ": its gradient was not final when its bucket was sent (Note [Gradient-ready hooks])");
  ready_[param] = 1;
  Bucket& b = buckets_[bucket_of_[param]];
  if (--b.pending == 0) {
    const size_t before = next_bucket_;
    start_ready_buckets();
    times_.started_in_backward += static_cast<int64_t>(next_bucket_ - before);
  }
  poll();
}

void GradientSync::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    for (size_t k = 0; k < b.members.size(); ++k) {
      const auto& p = params_[b.members[k]];
      auto slot = b.flat.narrow(0, b.offsets[k], p.numel());
      const auto& g = p.grad();
      if (!g.defined())
        slot.zero_();
      else if (!is_slot(g, slot, p))  // in place already: .grad is still last step's alias
        slot_view(slot, p).copy_(g);
    }
    if (next_bucket_ == 0) first_start_ = Clock::now();
    b.work = comm_->allreduce_sum_async(b.flat);
    ++next_bucket_;
  }
}

void GradientSync::poll() {
  while (oldest_in_flight_ < next_bucket_ && buckets_[oldest_in_flight_].work->test()) ++oldest_in_flight_;
}

void GradientSync::finish(Communicator& comm) {
  if (!armed_)
    throw std::logic_error("GradientSync::finish without begin_last_backward (rank " + std::to_string(comm.rank()) +
                           ")");
  const auto t0 = Clock::now();
  in_backward_ = false;
  // Parameters whose hook did not fire got no gradient this step (or overlap is off).
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) {
      ready_[i] = 1;
      --buckets_[bucket_of_[i]].pending;
    }
  start_ready_buckets();
  for (auto& b : buckets_) b.work->wait();
  // Note [Gradients as bucket views]: instead of copying the sums back, each .grad becomes an
  // alias of its slot in the bucket (c10d's gradient_as_bucket_view): no copy, and the step's
  // gradient tensors are freed. An alias made with set_(), not an autograd view: LibTorch's
  // Optimizer::zero_grad() calls detach_() on every .grad, which throws for views.
  // Gradients kept to the next step (zero_grad without set_to_none) then accumulate in place
  // in the buckets, and packing skips them; the trainer's set_to_none gives fresh gradients,
  // packed by one copy each.
  for (auto& b : buckets_)
    for (size_t k = 0; k < b.members.size(); ++k) {
      auto& p = params_[b.members[k]];
      auto slot = b.flat.narrow(0, b.offsets[k], p.numel());
      if (!p.grad().defined() || !is_slot(p.grad(), slot, p)) p.mutable_grad() = alias(slot, p);
    }
  const auto t1 = Clock::now();
  times_.exposed_s = seconds_between(t0, t1);
  times_.comm_s = buckets_.empty() ? 0.0 : seconds_between(first_start_, t1);
  reset_step();
}

void GradientSync::all_reduce(Communicator& comm) {
  begin(comm, /*hooks=*/false);  // everything starts in finish()
  finish(comm);
}

void GradientSync::reset_step() {
  for (auto& b : buckets_) {
    b.work.reset();
    b.pending = b.members.size();
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_bucket_ = 0;
  oldest_in_flight_ = 0;
  armed_ = false;
  in_backward_ = false;
  comm_ = nullptr;
}

}  // namespace lt::comm
