#pragma once
// Gradient bucketing as a pure function (c10d's compute_bucket_assignment_by_size): which
// gradients travel together in one all-reduce. Torch-free so it is tested without any
// process group.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace lt::comm {

struct BucketTensor {
  int64_t bytes;
  int dtype;  // any id: tensors of different dtypes never share a bucket
};

/// Assigns tensors, in the given order (the order their gradients become final in backward:
/// reverse parameter order), to buckets. The first bucket closes at `first_cap_bytes` so its
/// all-reduce starts early; later ones at `cap_bytes`. A tensor larger than the cap gets a
/// bucket of its own. Returns buckets of tensor indices; every index appears exactly once,
/// in order within each dtype.
std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketTensor>& tensors, int64_t first_cap_bytes,
                                                int64_t cap_bytes);

}  // namespace lt::comm
