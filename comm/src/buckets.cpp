#include "leantrain/comm/buckets.h"

#include <map>

namespace lt::comm {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<BucketTensor>& tensors, int64_t first_cap_bytes,
                                                int64_t cap_bytes) {
  std::vector<std::vector<size_t>> done;
  struct Open {
    std::vector<size_t> members;
    int64_t bytes = 0;
  };
  std::map<int, Open> open;  // one open bucket per dtype
  auto cap = [&] { return done.empty() ? first_cap_bytes : cap_bytes; };
  for (size_t i = 0; i < tensors.size(); ++i) {
    Open& b = open[tensors[i].dtype];
    b.members.push_back(i);
    b.bytes += tensors[i].bytes;
    if (b.bytes >= cap()) {
      done.push_back(std::move(b.members));
      b = Open{};
    }
  }
  for (auto& [dtype, b] : open)
    if (!b.members.empty()) done.push_back(std::move(b.members));
  return done;
}

}  // namespace lt::comm
