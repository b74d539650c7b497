#pragma once
// Private: portable random draws. std::uniform_*_distribution and std::normal_distribution are
// implementation-defined algorithms, so we derive everything from raw mt19937_64 output; a
// sample's content is then the same with libstdc++ and libc++, on every machine.
#include <cmath>
#include <cstdint>
#include <random>

namespace lt::data::detail {

/// Uniform in [0, n), n > 0, unbiased (rejects the 2^64 mod n lowest raw values).
inline uint64_t bounded(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;
  for (;;) {
    const uint64_t x = rng();
    if (x >= threshold) return x % n;
  }
}

/// Uniform in [0, 1) with 53 random bits.
inline double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

/// Two independent N(0,1) draws (Box–Muller).
inline void normal_pair(std::mt19937_64& rng, double& a, double& b) {
  const double u1 = 1.0 - uniform01(rng);  // (0, 1]: log is finite
  const double u2 = uniform01(rng);
  const double r = std::sqrt(-2.0 * std::log(u1));
  a = r * std::cos(6.283185307179586 * u2);
  b = r * std::sin(6.283185307179586 * u2);
}

// Stream tags, so the different uses of one seed never share a random stream.
enum Stream : uint64_t {
  kStreamMask = 0x6d61736b,       // bert masking, per (seed, epoch, index)
  kStreamSynthTrain = 0x74726e,   // synthetic samples, train split
  kStreamSynthEval = 0x65766c,    // synthetic samples, eval split
  kStreamTemplates = 0x746d706c,  // synthetic image class templates
  kStreamRules = 0x72756c65,      // synthetic token rules
};

}  // namespace lt::data::detail
