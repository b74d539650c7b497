#pragma once
// Gradient synchronisation: gradients packed into buckets (assign_buckets: a small first
// bucket, then ~comm.bucket_mb), each bucket one all-reduce per optimizer step. With overlap,
// a bucket's all-reduce starts during the last micro-batch's backward, as soon as all of its
// gradients are final, so communication runs behind the rest of backward (c10d's Reducer);
// earlier micro-batches communicate nothing. See Note [Gradient-ready hooks] in the .cpp.
//
// Contract (c10d's): every rank builds its GradientSync from the same parameters in the same
// order and calls begin_last_backward()/finish() (or all_reduce()) in the same steps. Buckets
// are started strictly in bucket order on every rank, whatever order gradients arrive in.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>

#include "leantrain/comm/communicator.h"

namespace lt::comm {

/// What the last synchronisation did, for the step metrics.
struct GradSyncTimes {
  /// From the first bucket's all-reduce starting to the sums being back in .grad: the span
  /// in which gradient communication was in flight (partly behind backward with overlap).
  double comm_s = 0;
  /// The part of it after backward returned — what the step waited for (finish()).
  double exposed_s = 0;
  /// Buckets whose all-reduce started inside backward (0 without overlap).
  int64_t started_in_backward = 0;
};

/// memory.shard (Note [Sharded model state] in the .cpp): what each rank keeps of the
/// gradients and the optimizer state.
enum class ShardStage {
  kNone,       // every rank all-reduces every bucket and updates every parameter
  kOptimizer,  // ZeRO-1: reduce-scatter of the full buckets once per step; each rank updates its chunk
  kGradients,  // ZeRO-2: each micro-batch's buckets reduce-scattered into per-rank chunk accumulators
};
/// "none" | "optimizer" | "gradients"; ConfigError naming memory.shard otherwise.
ShardStage parse_shard_stage(const std::string& s);
std::string to_string(ShardStage s);

/// A 1-D view of the elements of `t` (non-overlapping and dense: contiguous, channels-last,
/// ...) in memory order, sharing its storage; a bucket slot holds a gradient in this order
/// (Note [Gradients in the parameter's layout]). std::invalid_argument for other tensors.
torch::Tensor memory_order_view(const torch::Tensor& t);

/// One run of a parameter's elements, in the parameter's memory order, that this rank updates,
/// and where its reduced gradient lies (a 1-D view into this rank's chunk of a bucket).
struct ShardPiece {
  torch::Tensor param;  // the parameter (shares the model's TensorImpl)
  int64_t offset = 0;   // first element, in the parameter's memory order
  int64_t numel = 0;
  torch::Tensor grad;   // [numel] view of the reduced gradient (valid after finish())
  size_t bucket = 0;    // the bucket, and where the piece starts in this rank's chunk of it
  int64_t chunk_offset = 0;
};

class GradientSync {
 public:
  /// `overlap` = comm.overlap: start buckets from gradient-ready hooks inside backward, or
  /// all of them after it. `stage`, `world`, `rank`: memory.shard and this rank's place (the
  /// buckets are padded to a multiple of `world` elements). Allocates nothing until the first
  /// synchronisation. `accum_dtype`: kGradients' chunk accumulators (memory.grad_accum_dtype;
  /// kFloat or kBFloat16), whose views the ShardPieces' gradients then are.
  GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb,
               bool overlap = true, ShardStage stage = ShardStage::kNone, int world = 1, int rank = 0,
               torch::ScalarType accum_dtype = torch::kFloat);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Call before the backward of the step's last micro-batch (and only then): arms the
  /// hooks, which start each bucket's all-reduce on `comm` once its gradients are final.
  /// Without overlap it only marks the step.
  void begin_last_backward(Communicator& comm);
  /// kGradients: call before EVERY micro-batch's backward (last: whether it is the step's
  /// last), and end_backward() after each one but the last (finish() after the last). The
  /// other stages: begin_backward(comm, true) is begin_last_backward(comm).
  void begin_backward(Communicator& comm, bool last);
  /// kGradients, after a micro-batch's backward that is not the step's last: starts the
  /// buckets not yet started (missing gradients count as zeros), waits for them and adds this
  /// rank's chunks into its accumulators; the gradients are freed.
  void end_backward(Communicator& comm);
  /// The shard stages' all-gather after the update of this rank's pieces: every parameter
  /// then holds the values its owner ranks computed (bucket by bucket, at most two in flight).
  void allgather_params(Communicator& comm);
  /// kGradients: zeroes the chunk accumulators (an out-of-memory back-off drops a step's sums).
  void drop_shard_sums();
  /// The pieces this rank updates (allocates the buffers): for kNone none.
  std::vector<ShardPiece> shard_pieces();
  /// Zeroed [chunk] tensors, one per bucket, in `opts` (state to gather for a checkpoint).
  std::vector<torch::Tensor> chunk_buffers(const torch::TensorOptions& opts) const;
  /// Checkpoints of sharded state, a collective (bucket by bucket): `chunks[b]` holds this
  /// rank's values of bucket b (chunk_buffers). Returns on `root` every parameter's full
  /// values, 1-D in its memory order, in the order of the constructor's `params`; nothing on
  /// the other ranks.
  std::vector<torch::Tensor> gather_chunks(const std::vector<torch::Tensor>& chunks, Communicator& comm, int root) const;
  ShardStage stage() const { return stage_; }
  /// Call after that backward: starts the buckets not yet started (a parameter that got no
  /// gradient counts as zeros), waits for all; every .grad() is then its sum, as a view of
  /// its bucket buffer (Note [Gradients as bucket views] in the .cpp).
  void finish(Communicator& comm);
  /// The non-overlapped path in one call: sums every .grad() over ranks (undefined
  /// gradients count as 0). Equivalent to begin_last_backward() + finish() with
  /// no backward in between.
  void all_reduce(Communicator& comm);

  /// Allocates the persistent bucket buffers now (else at the first synchronisation).
  void allocate_buffers();

  size_t num_buckets() const { return buckets_.size(); }
  bool overlap() const { return overlap_; }
  /// Bytes of the persistent bucket buffers (0 before the first synchronisation).
  int64_t buffer_bytes() const { return buffer_bytes_; }
  /// memory.shard = gradients: the most transient bucket buffers (reduce-scatter or all-gather)
  /// alive at once since construction; the bound is kMaxBucketsInFlight (Note [Buckets in flight
  /// on a GPU], comm/src/grad_sync.cpp), which the planner's estimate of the buckets assumes.
  size_t peak_buckets_alive() const { return transients_peak_; }
  static constexpr size_t kMaxBucketsInFlight = 2;
  /// Whether `t` lives in a bucket buffer (a .grad aliased by finish() and kept, zeroed in
  /// place, by zero_grad without set_to_none).
  bool in_buckets(const torch::Tensor& t) const;
  /// The last synchronisation's times; between begin_last_backward() and finish(), the
  /// current one's so far (started_in_backward is final once backward has returned).
  const GradSyncTimes& last_times() const { return times_; }
  /// Called where comm_s starts (the step's first bucket, before its collective is issued), on
  /// the thread that starts it (backward's, with overlap): the trainer records a CUDA event
  /// there (Note [Step timings on a GPU], trainers/src/phase_clock.cpp).
  void set_first_bucket_hook(std::function<void()> hook) { first_bucket_hook_ = std::move(hook); }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    std::vector<int64_t> offsets; // element offset of each member in `flat`
    int64_t numel = 0;
    int64_t padded = 0;           // numel rounded up to a multiple of the world size
    torch::Tensor flat;           // persistent: allocated once, reused every step (kGradients: per micro-batch)
    torch::Tensor shard;          // kGradients: this rank's chunk accumulator (persistent)
    size_t pending = 0;           // members whose gradient is not final yet this step
    std::unique_ptr<Work> work;
  };

  void begin(Communicator& comm, bool hooks);
  void install_hooks();
  void mark_ready(size_t param);
  void start_ready_buckets();
  void poll();
  void reset_step();
  // kGradients: a bucket's reduce-scatter done (`host`: on the device too, Work::wait_host), its
  // chunk summed, the transient bucket freed.
  void wait_and_accumulate(Bucket& b, bool host = false);
  void transient_allocated();  // a transient bucket buffer (kGradients) came alive
  void transient_freed();
  // One parameter and no padding: its gradient / its memory can be the bucket itself.
  static bool sole_member(const Bucket& b) { return b.members.size() == 1 && b.padded == b.numel; }

  std::vector<torch::Tensor> params_;  // reverse parameter order (roughly backward's)
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;      // param index -> bucket
  std::vector<char> ready_;            // param index -> gradient final this step
  bool overlap_;
  ShardStage stage_;
  int world_, rank_;
  torch::ScalarType accum_dtype_;
  bool first_in_step_ = true;          // kGradients: the next micro-batch's chunks are copied, not added
  bool armed_ = false;
  bool in_backward_ = false;
  size_t next_bucket_ = 0;             // buckets start in order: the next one to start
  size_t oldest_in_flight_ = 0;        // the first bucket whose all-reduce may still run
  size_t transients_alive_ = 0, transients_peak_ = 0;  // kGradients: transient bucket buffers
  Communicator* comm_ = nullptr;       // set while armed
  int64_t buffer_bytes_ = 0;
  std::chrono::steady_clock::time_point first_start_;
  std::function<void()> first_bucket_hook_;
  GradSyncTimes times_;
  // The parameters' AccumulateGrad nodes with our hooks (held: a parameter keeps only a weak
  // reference, and a recreated node would have lost the hook) and each hook's key.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace lt::comm
