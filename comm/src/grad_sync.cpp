#include "leantrain/comm/grad_sync.h"

#include "leantrain/comm/buckets.h"

namespace lt::comm {

GradientSync::GradientSync(const std::vector<torch::Tensor>& params, double first_bucket_mb, double bucket_mb) {
  // Gradients become final roughly in reverse parameter order during backward.
  params_.assign(params.rbegin(), params.rend());
  std::vector<BucketTensor> sizes;
  for (const auto& p : params_)
    sizes.push_back({static_cast<int64_t>(p.numel() * p.element_size()), static_cast<int>(p.scalar_type())});
  buckets_ = assign_buckets(sizes, static_cast<int64_t>(first_bucket_mb * 1048576.0),
                            static_cast<int64_t>(bucket_mb * 1048576.0));
}

void GradientSync::all_reduce(Communicator& comm) {
  std::vector<torch::Tensor> flats;
  for (const auto& bucket : buckets_) {
    std::vector<torch::Tensor> parts;
    for (size_t i : bucket) {
      auto& p = params_[i];
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      parts.push_back(p.grad().reshape({-1}));
    }
    flats.push_back(torch::cat(parts));
  }
  comm.allreduce_sum_many(flats);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t offset = 0;
    for (size_t i : buckets_[b]) {
      auto& g = params_[i].mutable_grad();
      g.copy_(flats[b].narrow(0, offset, g.numel()).view_as(g));
      offset += g.numel();
    }
  }
}

}  // namespace lt::comm
