#pragma once
// Gradient synchronisation: gradients packed into buckets (assign_buckets: a small first
// bucket, then ~comm.bucket_mb), each bucket one all-reduce, all buckets in flight at once.
// Called once per optimizer step, after the last micro-batch — never on earlier ones.
#include <vector>

#include <torch/torch.h>

#include "leantrain/comm/communicator.h"

namespace lt::comm {

class GradientSync {
 public:
  GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb);
  /// Sums every parameter's .grad() over ranks, in place (undefined gradients count as 0).
  void all_reduce(Communicator& comm);
  size_t num_buckets() const { return buckets_.size(); }

 private:
  std::vector<torch::Tensor> params_;
  std::vector<std::vector<size_t>> buckets_;
};

}  // namespace lt::comm
