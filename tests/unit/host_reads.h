#pragma once
// Counts the ATen operators that read a tensor's values on the host (on CUDA each one waits
// for the stream: `.item()` is _local_scalar_dense; nonzero, masked_select and the unique
// family size their output by a count they read), called on this thread and on the autograd
// threads its backward runs on, while a HostReads is alive. On the CPU these are the same
// operators a GPU run would call, so a test can force a device's path on the CPU and check it
// reads nothing back (Note [Counts read behind the queue], recompute/src/host_readback.cpp).
#include <ATen/record_function.h>

#include <atomic>
#include <mutex>
#include <set>
#include <string>

namespace lt_test {

class HostReads {
 public:
  HostReads() {
    count_() = 0;
    names_().clear();
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback(&HostReads::on_op).scopes({at::RecordScope::FUNCTION}));
  }
  ~HostReads() { at::removeCallback(handle_); }
  HostReads(const HostReads&) = delete;
  HostReads& operator=(const HostReads&) = delete;

  int64_t count() const { return count_(); }
  /// The operators seen, for a failure's message.
  std::string names() const {
    std::lock_guard<std::mutex> lock(mutex_());
    std::string s;
    for (const auto& n : names_()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }

 private:
  static std::unique_ptr<at::ObserverContext> on_op(const at::RecordFunction& fn) {
    static const std::set<std::string> reads = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
                                                "aten::_unique2",            "aten::unique_dim", "aten::unique_consecutive",
                                                "aten::is_nonzero",          "aten::equal"};
    const std::string name = fn.name();
    if (reads.count(name) > 0) {
      ++count_();
      std::lock_guard<std::mutex> lock(mutex_());
      names_().insert(name);
    }
    return nullptr;
  }
  static std::atomic<int64_t>& count_() {
    static std::atomic<int64_t> n{0};
    return n;
  }
  static std::set<std::string>& names_() {
    static std::set<std::string> s;
    return s;
  }
  static std::mutex& mutex_() {
    static std::mutex m;
    return m;
  }
  at::CallbackHandle handle_;
};

}  // namespace lt_test
