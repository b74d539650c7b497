// Epoch permutations and micro-batch slicing. Torch-free: see sampling.h.
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "leantrain/data/sampling.h"
#include "rng.h"

namespace lt::data {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t mix_seed(std::initializer_list<uint64_t> parts) {
  uint64_t h = 0x6a09e667f3bcc909ULL;
  for (uint64_t p : parts) h = splitmix64(h ^ splitmix64(p));
  return h;
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  if (n < 0) throw std::invalid_argument("epoch_permutation: n = " + std::to_string(n) + " < 0");
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(mix_seed({seed, static_cast<uint64_t>(epoch)}));
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(detail::bounded(rng, static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

int64_t global_batches_per_epoch(int64_t n, int64_t global_batch) {
  if (global_batch <= 0) {
    throw std::invalid_argument("global_batches_per_epoch: global_batch = " + std::to_string(global_batch));
  }
  return n < 0 ? 0 : n / global_batch;
}

std::vector<int64_t> micro_batch_indices(const std::vector<int64_t>& perm, int64_t k, int64_t micro,
                                         int64_t accumulation, int64_t world, int64_t rank, int64_t j) {
  if (micro <= 0 || accumulation <= 0 || world <= 0) {
    throw std::invalid_argument("micro_batch_indices: micro = " + std::to_string(micro) + ", accumulation = " +
                                std::to_string(accumulation) + ", world = " + std::to_string(world) +
                                " must all be > 0");
  }
  if (rank < 0 || rank >= world || j < 0 || j >= accumulation) {
    throw std::invalid_argument("micro_batch_indices: rank " + std::to_string(rank) + " of " +
                                std::to_string(world) + ", micro-batch " + std::to_string(j) + " of " +
                                std::to_string(accumulation) + " out of range");
  }
  const int64_t G = world * accumulation * micro;
  const auto n = static_cast<int64_t>(perm.size());
  if (k < 0 || (k + 1) * G > n) {
    throw std::out_of_range("micro_batch_indices: global batch " + std::to_string(k) + " of size " +
                            std::to_string(G) + " does not fit in " + std::to_string(n) + " samples");
  }
  const int64_t begin = k * G + (rank * accumulation + j) * micro;
  return {perm.begin() + begin, perm.begin() + begin + micro};
}

}  // namespace lt::data
