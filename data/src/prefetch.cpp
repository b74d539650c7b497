// The Prefetcher: one background thread building wanted batches in order (prefetch.h).
#include "leantrain/data/prefetch.h"

#include <exception>
#include <stdexcept>
#include <utility>

namespace lt::data {

struct Prefetcher::Slot {
  std::vector<int64_t> indices;
  int64_t epoch = 0;
  enum State { kQueued, kBuilding, kDone } state = kQueued;
  bool dropped = false;
  Batch batch;
  std::exception_ptr error;
};

Prefetcher::Prefetcher(std::shared_ptr<const Dataset> data, int max_pending, std::function<void(Batch&)> prepare)
    : data_(std::move(data)),
      prepare_(std::move(prepare)),
      max_pending_(static_cast<size_t>(max_pending > 0 ? max_pending : 1)) {
  if (!data_) throw std::invalid_argument("Prefetcher: no dataset");
  thread_ = std::thread([this] { loop(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& s : pending_) s->dropped = true;
    pending_.clear();
  }
  work_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Prefetcher::want(std::vector<int64_t> indices, int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& s : pending_)
      if (s->epoch == epoch && s->indices == indices) return;  // already wanted
    if (pending_.size() >= max_pending_) return;
    auto s = std::make_shared<Slot>();
    s->indices = std::move(indices);
    s->epoch = epoch;
    pending_.push_back(std::move(s));
  }
  work_cv_.notify_one();
}

Batch Prefetcher::take(const std::vector<int64_t>& indices, int64_t epoch) {
  std::shared_ptr<Slot> slot;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (!pending_.empty()) {
      auto front = pending_.front();
      pending_.pop_front();
      if (front->epoch == epoch && front->indices == indices) {
        slot = std::move(front);
        break;
      }
      front->dropped = true;  // wanted earlier but not taken: the caller moved on
    }
    if (!slot) {
      ++misses_;
    } else {
      ++hits_;
      // Not started (the thread is still on a batch dropped above): build it here.
      if (slot->state == Slot::kQueued) slot.reset();
      else done_cv_.wait(lock, [&] { return slot->state == Slot::kDone; });
    }
  }
  if (!slot) return build(indices, epoch);
  if (slot->error) std::rethrow_exception(slot->error);
  return std::move(slot->batch);
}

Batch Prefetcher::build(const std::vector<int64_t>& indices, int64_t epoch) const {
  Batch b = data_->get(indices, epoch);
  if (prepare_) prepare_(b);
  return b;
}

void Prefetcher::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : pending_) s->dropped = true;
  pending_.clear();
}

int64_t Prefetcher::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t Prefetcher::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

void Prefetcher::loop() {
  for (;;) {
    std::shared_ptr<Slot> slot;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] {
        if (stop_) return true;
        for (auto& s : pending_)
          if (s->state == Slot::kQueued) return true;
        return false;
      });
      if (stop_) return;
      for (auto& s : pending_)
        if (s->state == Slot::kQueued) {
          slot = s;
          break;
        }
      slot->state = Slot::kBuilding;
    }
    Batch b;
    std::exception_ptr err;
    try {
      b = build(slot->indices, slot->epoch);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!slot->dropped) {
        slot->batch = std::move(b);
        slot->error = err;
      }
      slot->state = Slot::kDone;
    }
    done_cv_.notify_all();
  }
}

}  // namespace lt::data
