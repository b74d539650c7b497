#pragma once
// Builds batches ahead on a background thread, over any Dataset: the caller says which batches
// it will take next (want), and takes them in that order (take). A batch is the same whether it
// was prefetched or built in take(): Dataset::get is a pure function of (indices, epoch).
//
//   Prefetcher pf(train_set);
//   for (j = 0; j < A; ++j) {
//     Batch b = pf.take(micro_batch(j), epoch);   // waits only if it is not built yet
//     pf.want(next micro-batch: j + 1, or the next step's first, epoch);
//     ...forward/backward of b, while the next one is built...
//   }
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "leantrain/data/dataset.h"

namespace lt::data {

class Prefetcher {
 public:
  /// `max_pending`: wanted batches held at once (built or not); a want() beyond it is ignored
  /// (take() then builds that batch itself). One background thread builds them in want() order;
  /// the Dataset parallelises inside get() (image_folder's workers).
  /// `prepare`, when given, runs on every batch right after Dataset::get, on the thread that
  /// built it (the background thread, or take()'s caller): on a GPU the trainer pins the batch
  /// there, so that its copy to the device can be non-blocking (Note [Pinned batches]).
  explicit Prefetcher(std::shared_ptr<const Dataset> data, int max_pending = 2,
                      std::function<void(Batch&)> prepare = {});
  /// Stops the background thread after the batch it is building (if any) and joins it; batches
  /// not taken are dropped.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// Starts building get(indices, epoch) in the background (after the batches wanted before);
  /// a batch already pending is not wanted twice.
  void want(std::vector<int64_t> indices, int64_t epoch);
  /// get(indices, epoch): the wanted batch (waiting for it; its exception, if building it threw,
  /// is rethrown here), or built now on the calling thread when it was not wanted or the
  /// background thread has not started it yet. Batches
  /// wanted before the one taken are dropped; a take() of a batch that was not wanted drops
  /// every pending batch (the caller changed its plan, e.g. an out-of-memory back-off re-slices
  /// the micro-batches).
  Batch take(const std::vector<int64_t>& indices, int64_t epoch);
  /// Drops every pending batch (the one being built finishes and is discarded).
  void clear();

  /// Counters, for the log and tests: takes of a wanted batch / of a batch not wanted.
  int64_t hits() const;
  int64_t misses() const;

 private:
  struct Slot;
  void loop();

  Batch build(const std::vector<int64_t>& indices, int64_t epoch) const;  // get + prepare

  std::shared_ptr<const Dataset> data_;
  std::function<void(Batch&)> prepare_;
  size_t max_pending_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::shared_ptr<Slot>> pending_;  // want() order, built or not
  bool stop_ = false;
  int64_t hits_ = 0, misses_ = 0;
  std::thread thread_;  // last: starts after the members it reads
};

}  // namespace lt::data
