#pragma once
// Epoch shuffling and the split of a global batch over ranks and micro-batches. Torch-free and
// independent of LibTorch's RNG so that every rank, and a resumed run, computes the same order
// from the config alone (no RNG state needs to be checkpointed or broadcast).
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace lt::data {

/// SplitMix64 finalizer: turns structured inputs (seed, epoch, index, ...) into well-spread
/// 64-bit seeds, so neighbouring indices get unrelated random streams.
uint64_t splitmix64(uint64_t x);

/// Combines several values into one seed; order matters. Used to give every (seed, epoch,
/// sample) its own independent stream.
uint64_t mix_seed(std::initializer_list<uint64_t> parts);

/// Shuffling is a pure function of (seed, epoch): a Fisher–Yates permutation of [0,n) driven by
/// std::mt19937_64 seeded from mix_seed({seed, epoch}). Bounded draws use our own rejection
/// sampling rather than std::uniform_int_distribution, whose algorithm differs between standard
/// libraries — so the order is identical on every platform.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

/// Global batches per epoch: the incomplete tail is dropped so that every optimizer step sees
/// exactly `global_batch` samples whatever the layout. Throws std::invalid_argument if
/// global_batch <= 0.
int64_t global_batches_per_epoch(int64_t n, int64_t global_batch);

/// The sample indices of micro-batch j (0 <= j < accumulation) of rank r in global batch k of an epoch:
/// global batch k = perm[k*G, (k+1)*G) with G = world*accumulation*micro; that slice is split into
/// contiguous chunks of `micro`, chunk number (r*accumulation + j). So the union over ranks and micro-batches
/// is the same set for any world size / micro-batch size (PRODUCT.md invariant), and changing the
/// layout changes only how a step's gradient is summed, not which samples it sees.
/// Throws std::invalid_argument on a non-positive size or out-of-range rank/j, std::out_of_range
/// if global batch k does not fit in `perm`.
std::vector<int64_t> micro_batch_indices(const std::vector<int64_t>& perm, int64_t k, int64_t micro,
                                         int64_t accumulation, int64_t world, int64_t rank, int64_t j);

}  // namespace lt::data
