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
#include <memory>
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

class GradientSync {
 public:
  /// `overlap` = comm.overlap: start buckets from gradient-ready hooks inside backward, or
  /// all of them after it. Allocates nothing until the first synchronisation.
  GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb,
               bool overlap = true);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  /// Call before the backward of the step's last micro-batch (and only then): arms the
  /// hooks, which start each bucket's all-reduce on `comm` once its gradients are final.
  /// Without overlap it only marks the step.
  void begin_last_backward(Communicator& comm);
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
  /// Whether `t` lives in a bucket buffer (a .grad aliased by finish() and kept, zeroed in
  /// place, by zero_grad without set_to_none).
  bool in_buckets(const torch::Tensor& t) const;
  /// The last synchronisation's times; between begin_last_backward() and finish(), the
  /// current one's so far (started_in_backward is final once backward has returned).
  const GradSyncTimes& last_times() const { return times_; }

 private:
  struct Bucket {
    std::vector<size_t> members;  // indices into params_
    std::vector<int64_t> offsets; // element offset of each member in `flat`
    int64_t numel = 0;
    torch::Tensor flat;           // persistent: allocated once, reused every step
    size_t pending = 0;           // members whose gradient is not final yet this step
    std::unique_ptr<Work> work;
  };

  void begin(Communicator& comm, bool hooks);
  void install_hooks();
  void mark_ready(size_t param);
  void start_ready_buckets();
  void poll();
  void reset_step();

  std::vector<torch::Tensor> params_;  // reverse parameter order (roughly backward's)
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;      // param index -> bucket
  std::vector<char> ready_;            // param index -> gradient final this step
  bool overlap_;
  bool armed_ = false;
  bool in_backward_ = false;
  size_t next_bucket_ = 0;             // buckets start in order: the next one to start
  size_t oldest_in_flight_ = 0;        // the first bucket whose all-reduce may still run
  Communicator* comm_ = nullptr;       // set while armed
  int64_t buffer_bytes_ = 0;
  std::chrono::steady_clock::time_point first_start_;
  GradSyncTimes times_;
  // The parameters' AccumulateGrad nodes with our hooks (held: a parameter keeps only a weak
  // reference, and a recreated node would have lost the hook) and each hook's key.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;
};

}  // namespace lt::comm
