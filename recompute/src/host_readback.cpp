#include "leantrain/recompute/host_readback.h"

#include <numeric>

#ifdef LEANTRAIN_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lt::recompute {

// Note [Counts read behind the queue]
// A shape that depends on data (how many targets a masked-LM batch keeps, how many elements
// of a ReLU output are nonzero) needs its count on the host before the tensor of that shape
// can be allocated. `.item()` or nonzero() read it by synchronising the stream: the host
// waits until the device has run everything queued so far, the queue is then empty, and the
// device idles while the host launches the next kernels (on a GPU several microseconds each,
// and a step of thousands of kernels keeps the device busy only while the host stays ahead).
// A count needed later than it can be computed is read differently: the count is copied
// (non_blocking) into pinned host memory right after the kernel that makes it, an event is
// recorded behind the copy, and the host goes on queueing other work (the encoder's blocks
// before BERT's head; the next ResNet block before a block input is packed). When the count
// is needed, the host waits for that event only: the device is still busy with the work
// queued after it, so nothing drains. Elsewhere than on CUDA the count is read at once.
struct HostReadback::Pending {
  at::Tensor host;  // pinned, filled by the copy
#ifdef LEANTRAIN_TORCH_CUDA
  at::cuda::CUDAEvent copied;  // recorded behind the copy; timing off
#endif
};

HostReadback::HostReadback(const at::Tensor& values) {
  const auto flat = values.reshape({-1}).to(at::kLong);
#ifdef LEANTRAIN_TORCH_CUDA
  if (flat.is_cuda()) {
    pending_ = std::make_shared<Pending>();
    pending_->host = at::empty(flat.sizes(), flat.options().device(at::kCPU).pinned_memory(true));
    pending_->host.copy_(flat, /*non_blocking=*/true);
    pending_->copied.record(c10::cuda::getCurrentCUDAStream(flat.device().index()));
    return;
  }
#endif
  const auto host = flat.cpu().contiguous();
  values_.assign(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
}

const std::vector<int64_t>& HostReadback::values() {
  if (pending_) {
#ifdef LEANTRAIN_TORCH_CUDA
    pending_->copied.synchronize();
#endif
    const auto& h = pending_->host;
    values_.assign(h.data_ptr<int64_t>(), h.data_ptr<int64_t>() + h.numel());
    pending_.reset();
  }
  return values_;
}

int64_t HostReadback::sum() {
  const auto& v = values();
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

}  // namespace lt::recompute
