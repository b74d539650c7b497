#include "leantrain/comm/grad_sync.h"

#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <functional>
#include <stdexcept>
#include <string>

#include "leantrain/comm/buckets.h"
#include "leantrain/runtime/errors.h"

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

// Whether gradient g (maybe undefined) has p's dense layout, as p's bucket slot would hold it.
bool is_slot_layout(const torch::Tensor& g, const torch::Tensor& p) {
  return g.defined() && g.scalar_type() == p.scalar_type() && g.sizes() == p.sizes() && g.strides() == p.strides() &&
         g.is_non_overlapping_and_dense();
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

}  // namespace

// Note [Sharded model state]
// memory.shard = optimizer | gradients is ZeRO stage 1 / 2 (DeepSpeed; llm.c ships stage 1) on
// the same buckets as the all-reduce. Each bucket is padded to a multiple of the world size
// and split into equal chunks (Note [Shard chunks]); rank r owns chunk r of every bucket: it
// keeps the optimizer state of those elements only and updates only them (ShardPiece: the
// runs of parameters a chunk covers, cut wherever a chunk boundary falls inside a parameter).
// Per step:
//  - optimizer (stage 1): backward accumulates into the full persistent buckets as with
//    kNone; the step's one collective per bucket is a reduce-scatter instead of an all-reduce
//    (started from the same gradient-ready hooks, in bucket order), leaving the sum in this
//    rank's chunk. After the update, allgather_params() packs this rank's updated elements
//    into its chunk of the same bucket buffer (its gradients are spent) and all-gathers it in
//    place: every rank then copies the bucket into its parameters. Reduce-scatter plus
//    all-gather move the bytes of one all-reduce (the ring all-reduce is these two phases).
//  - gradients (stage 2): every micro-batch's backward sends each bucket as soon as it is
//    ready: packed into a transient buffer, the parameters' gradients freed at once,
//    reduce-scattered, and this rank's chunk added into a persistent chunk accumulator
//    (DeepSpeed's stage 2 reduces per micro-batch likewise). A rank then holds 1/N of the
//    gradients between backwards plus the buckets in flight (at most two: a third waits for
//    the oldest), instead of all of them; the price
//    is one reduce-scatter per bucket per micro-batch: with accumulation A a step moves
//    A reduce-scatters + 1 all-gather, the all-reduce's bytes only at A = 1. The all-gather
//    uses a transient bucket buffer, at most two buckets in flight.
//    With memory.grad_accum_dtype = bf16 the chunk accumulators are bf16 (DeepSpeed's
//    data_types.grad_accum_dtype; ZeRO's own accounting keeps 16-bit gradient partitions):
//    2 bytes a parameter over N ranks instead of 4. The buckets and their reduce-scatter stay
//    in the gradients' fp32 (MPI has no bf16 type: staging it through fp32 would add a copy
//    of each bucket in flight); each chunk is rounded once as it is copied or added into its
//    accumulator, so with accumulation A the sum over micro-batches is A - 1 bf16 additions.
//    The optimizer reads the sums a bucket at a time as fp32 (ShardedOptimizer::step_scaled).
// The global gradient norm (clipping, the inf check) is the square root of the all-reduced
// sum of each rank's squared chunk norms: each element is in exactly one chunk, the padding
// in none (trainers/src/precision.cpp). Padding is zero and never read.
torch::Tensor memory_order_view(const torch::Tensor& t) {
  if (!t.is_non_overlapping_and_dense())
    throw std::invalid_argument("memory_order_view: the tensor is not dense (sizes " + c10::str(t.sizes()) +
                                ", strides " + c10::str(t.strides()) + ")");
  return t.detach().as_strided({t.numel()}, {1}, t.storage_offset());
}

ShardStage parse_shard_stage(const std::string& s) {
  if (s == "none") return ShardStage::kNone;
  if (s == "optimizer") return ShardStage::kOptimizer;
  if (s == "gradients") return ShardStage::kGradients;
  throw ConfigError("memory.shard = '" + s + "' is not one of none, optimizer (ZeRO-1: optimizer state sharded), "
                    "gradients (ZeRO-2: gradients and optimizer state sharded)");
}

std::string to_string(ShardStage s) {
  switch (s) {
    case ShardStage::kOptimizer: return "optimizer";
    case ShardStage::kGradients: return "gradients";
    default: return "none";
  }
}

namespace {

using Clock = std::chrono::steady_clock;

// Note [Buckets in flight on a GPU]: sharded gradients keep at most kMaxBucketsInFlight
// transient buckets alive (Note [Sharded model state]): before a third is packed, the oldest is
// waited for, summed into its chunk and freed. On the CPU, MPI's wait() blocks the host until
// the reduce-scatter is done, so that bounds memory. On a GPU, Work::wait() only orders the
// compute stream after the NCCL stream: the host runs on, frees the bucket (whose block the
// caching allocator cannot hand out again until the NCCL stream has passed it) and allocates
// the next one, so every bucket of the step could be alive at its end while the bound said two.
// So the back-pressure waits with Work::wait_host(), which also blocks the host until the
// collective has completed on the device: the freed block is reusable at once, and the bound
// holds on the device as it does on the host. The cost is one host sync per bucket beyond the
// first two, while the GPU still has the rest of backward queued. The all-gather after the
// update does the same. peak_buckets_alive() counts the buffers; a test holds it to the bound
// with a communicator whose collectives complete late.
constexpr size_t kMaxInFlight = GradientSync::kMaxBucketsInFlight;
double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

}  // namespace

GradientSync::GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb,
                           bool overlap, ShardStage stage, int world, int rank, torch::ScalarType accum_dtype)
    : overlap_(overlap), stage_(stage), world_(world), rank_(rank), accum_dtype_(accum_dtype) {
  if (stage_ != ShardStage::kNone)
    for (const auto& p : params)
      if (!p.is_non_overlapping_and_dense())
        throw ConfigError("memory.shard = '" + to_string(stage_) + "' needs dense parameters (contiguous or "
                          "channels-last); one has sizes " + c10::str(p.sizes()) + " and strides " +
                          c10::str(p.strides()) + "; use memory.shard = 'none'");
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
    const int64_t w = stage_ == ShardStage::kNone ? 1 : world_;
    b.padded = (b.numel + w - 1) / w * w;
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
    const auto opts = params_[b.members.front()].options().requires_grad(false);
    if (stage_ == ShardStage::kGradients) {
      b.shard = torch::zeros({b.padded / world_}, opts.dtype(accum_dtype_));
      buffer_bytes_ += static_cast<int64_t>(b.shard.nbytes());
    } else {
      b.flat = torch::zeros({b.padded}, opts);
      buffer_bytes_ += static_cast<int64_t>(b.flat.nbytes());
      // Note [Gradients as bucket views] from the first backward on: a parameter without a
      // gradient yet gets its zeroed slot as .grad, so backward accumulates into the bucket
      // and the first step holds no second copy of the gradients either.
      for (size_t k = 0; k < b.members.size(); ++k) {
        auto& p = params_[b.members[k]];
        if (p.requires_grad() && !p.grad().defined()) p.mutable_grad() = alias(b.flat.narrow(0, b.offsets[k], p.numel()), p);
      }
    }
  }
}

std::vector<ShardPiece> GradientSync::shard_pieces() {
  std::vector<ShardPiece> pieces;
  if (stage_ == ShardStage::kNone) return pieces;
  allocate_buffers();
  for (auto& b : buckets_) {
    const int64_t c = b.padded / world_, lo = rank_ * c, hi = lo + c;
    const auto mine = stage_ == ShardStage::kGradients ? b.shard : shard_chunk(b.flat, rank_, world_);
    for (size_t k = 0; k < b.members.size(); ++k) {
      const int64_t off = b.offsets[k], n = params_[b.members[k]].numel();
      const int64_t a = std::max(lo, off), e = std::min(hi, off + n);
      if (a >= e) continue;
      pieces.push_back({params_[b.members[k]], a - off, e - a, mine.narrow(0, a - lo, e - a),
                        static_cast<size_t>(&b - buckets_.data()), a - lo});
    }
  }
  return pieces;
}

std::vector<torch::Tensor> GradientSync::chunk_buffers(const torch::TensorOptions& opts) const {
  std::vector<torch::Tensor> out;
  for (const auto& b : buckets_) out.push_back(torch::zeros({b.padded / world_}, opts));
  return out;
}

std::vector<torch::Tensor> GradientSync::gather_chunks(const std::vector<torch::Tensor>& chunks, Communicator& comm,
                                                       int root) const {
  std::vector<torch::Tensor> full;
  if (comm.rank() == root) full.resize(params_.size());
  for (size_t bi = 0; bi < buckets_.size(); ++bi) {
    const auto& b = buckets_[bi];
    const auto parts = comm.allgather(chunks[bi]);  // N x [chunk]: one bucket at a time
    if (comm.rank() != root) continue;
    const auto flat = torch::cat(parts);
    for (size_t k = 0; k < b.members.size(); ++k)
      full[b.members[k]] = flat.narrow(0, b.offsets[k], params_[b.members[k]].numel()).clone();
  }
  std::reverse(full.begin(), full.end());  // params_ is in reverse order
  return full;
}

bool GradientSync::in_buckets(const torch::Tensor& t) const {
  if (!t.defined() || !t.has_storage()) return false;
  for (const auto& b : buckets_)
    if ((b.flat.defined() && t.storage().is_alias_of(b.flat.storage())) ||
        (b.shard.defined() && t.storage().is_alias_of(b.shard.storage())))
      return true;
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

void GradientSync::begin_backward(Communicator& comm, bool last) {
  if (last || stage_ == ShardStage::kGradients) begin(comm, overlap_);
}

void GradientSync::end_backward(Communicator& comm) {
  if (stage_ != ShardStage::kGradients) return;
  if (!armed_)
    throw std::logic_error("GradientSync::end_backward without begin_backward (rank " + std::to_string(comm.rank()) +
                           ")");
  finish(comm);  // kGradients: accumulates into the chunks and leaves no gradient behind
  first_in_step_ = false;
}

void GradientSync::drop_shard_sums() {
  for (auto& b : buckets_)
    if (b.shard.defined()) b.shard.zero_();
  first_in_step_ = true;
}

void GradientSync::wait_and_accumulate(Bucket& b, bool host) {
  if (!b.flat.defined()) return;  // accumulated already
  if (host) b.work->wait_host();  // Note [Buckets in flight on a GPU]
  else b.work->wait();
  torch::NoGradGuard no_grad;
  const auto mine = shard_chunk(b.flat, rank_, world_);
  if (first_in_step_) b.shard.copy_(mine);
  else b.shard.add_(mine);  // in the accumulator's dtype: fp32, or fp32 sums rounded to bf16
  b.flat = torch::Tensor();  // the transient bucket: freed now, with the Work that held it
  b.work.reset();
  transient_freed();
}

void GradientSync::transient_allocated() {
  transients_peak_ = std::max(transients_peak_, ++transients_alive_);
}

void GradientSync::transient_freed() {
  if (transients_alive_ > 0) --transients_alive_;
}

void GradientSync::allgather_params(Communicator& comm) {
  if (stage_ == ShardStage::kNone) return;
  torch::NoGradGuard no_grad;
  // Copies a bucket into its parameters once its all-gather is done.
  auto unpack = [&](Bucket& b) {
    if (stage_ == ShardStage::kGradients) b.work->wait_host();  // Note [Buckets in flight on a GPU]
    else b.work->wait();
    const bool in_place = stage_ == ShardStage::kGradients && sole_member(b);  // gathered in the parameter
    for (size_t k = 0; k < b.members.size() && !in_place; ++k) {
      const auto& p = params_[b.members[k]];
      memory_order_view(p).copy_(b.flat.narrow(0, b.offsets[k], p.numel()));
    }
    b.work.reset();
    if (stage_ == ShardStage::kGradients) {
      b.flat = torch::Tensor();
      transient_freed();
    }
  };
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Bucket& b = buckets_[i];
    if (stage_ == ShardStage::kGradients && sole_member(b)) {
      // One parameter, no padding: the all-gather runs in its own memory (this rank's chunk
      // holds its update already), with no transient bucket and no copy.
      if (i >= 2) unpack(buckets_[i - 2]);  // first: at most two in flight, this one included
      b.flat = memory_order_view(params_[b.members.front()]);
      transient_allocated();  // the parameter's own memory, counted as a bucket in flight
      b.work = comm.allgather_async(b.flat);
      continue;
    }
    if (i >= 2) unpack(buckets_[i - 2]);
    if (stage_ == ShardStage::kGradients) {
      b.flat = torch::zeros({b.padded}, params_[b.members.front()].options().requires_grad(false));
      transient_allocated();
    }
    const int64_t c = b.padded / world_, lo = rank_ * c, hi = lo + c;
    for (size_t k = 0; k < b.members.size(); ++k) {  // this rank's updated elements into its chunk
      const auto& p = params_[b.members[k]];
      const int64_t off = b.offsets[k], a = std::max(lo, off), e = std::min(hi, off + p.numel());
      if (a < e) b.flat.narrow(0, a, e - a).copy_(memory_order_view(p).narrow(0, a - off, e - a));
    }
    b.work = comm.allgather_async(b.flat);
  }
  for (size_t i = buckets_.size() >= 2 ? buckets_.size() - 2 : 0; i < buckets_.size(); ++i) unpack(buckets_[i]);
}

void GradientSync::begin(Communicator& comm, bool hooks) {
  if (armed_)
    throw std::logic_error("GradientSync::begin_last_backward called twice without finish() (rank " +
                           std::to_string(comm.rank()) + ")");
  allocate_buffers();
  if (hooks) install_hooks();
  comm_ = &comm;
  armed_ = true;
  in_backward_ = hooks;
  if (first_in_step_ || stage_ != ShardStage::kGradients) times_ = GradSyncTimes{};  // kGradients: summed over the step
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
    const bool transient = stage_ == ShardStage::kGradients;
    // Sharded gradients: at most kMaxInFlight transient buckets at once. Open MPI progresses a
    // collective only inside MPI calls, so without the bound backward runs ahead of the
    // reduce-scatters and every bucket of the step is alive at its end: a whole copy of the
    // gradients (the model-state benchmark measured 391 MiB more than stage 1 at 9 layers).
    while (transient && next_bucket_ - oldest_in_flight_ >= kMaxInFlight) {
      wait_and_accumulate(buckets_[oldest_in_flight_], /*host=*/true);
      ++oldest_in_flight_;
    }
    bool packed = false;
    if (transient && sole_member(b) && is_slot_layout(params_[b.members.front()].grad(), params_[b.members.front()])) {
      // A bucket of one parameter whose gradient is laid out as its slot would be (the tied
      // embedding, 154 MB in GPT-2): the gradient is the bucket, no copy.
      auto& p = params_[b.members.front()];
      b.flat = memory_order_view(p.grad());
      p.mutable_grad() = torch::Tensor();
      packed = true;
      transient_allocated();
    } else if (transient) {
      b.flat = torch::empty({b.padded}, params_[b.members.front()].options().requires_grad(false));
      b.flat.narrow(0, b.numel, b.padded - b.numel).zero_();
      transient_allocated();
    }
    for (size_t k = 0; k < b.members.size() && !packed; ++k) {
      auto& p = params_[b.members[k]];
      auto slot = b.flat.narrow(0, b.offsets[k], p.numel());
      const auto& g = p.grad();
      if (!g.defined())
        slot.zero_();
      else if (!is_slot(g, slot, p))  // in place already: .grad is still last step's alias
        slot_view(slot, p).copy_(g);
      if (transient) p.mutable_grad() = torch::Tensor();  // packed: the rank keeps only its chunk's sums
    }
    if (next_bucket_ == 0 && (first_in_step_ || !transient)) {
      first_start_ = Clock::now();
      if (first_bucket_hook_) first_bucket_hook_();
    }
    b.work = stage_ == ShardStage::kNone ? comm_->allreduce_sum_async(b.flat) : comm_->reduce_scatter_sum_async(b.flat);
    ++next_bucket_;
  }
}

void GradientSync::poll() {
  while (oldest_in_flight_ < next_bucket_ && buckets_[oldest_in_flight_].work->test()) {
    if (stage_ == ShardStage::kGradients) wait_and_accumulate(buckets_[oldest_in_flight_]);  // frees it early
    ++oldest_in_flight_;
  }
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
  if (stage_ == ShardStage::kGradients) {  // no gradient stays behind: the chunks hold the sums
    for (auto& b : buckets_) wait_and_accumulate(b);
    const auto t1 = Clock::now();
    times_.exposed_s += seconds_between(t0, t1);
    times_.comm_s = buckets_.empty() ? 0.0 : seconds_between(first_start_, t1);
    reset_step();
    first_in_step_ = true;  // end_backward() sets it back to false for a micro-batch that is not the last
    return;
  }
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
