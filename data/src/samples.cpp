// Per-sample content generators. Torch-free: see samples.h.
#include "samples.h"

#include <algorithm>
#include <random>

#include "leantrain/data/sampling.h"
#include "rng.h"

namespace lt::data::detail {

int64_t bert_mask(int64_t* input, int64_t* target, int64_t T, uint64_t seed, int64_t epoch, int64_t index,
                  double mask_prob, int64_t mask_token, int64_t random_vocab, const std::vector<int64_t>& never) {
  std::mt19937_64 rng(mix_seed({seed, kStreamMask, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)}));
  auto special = [&](int64_t p) { return std::find(never.begin(), never.end(), input[p]) != never.end(); };
  std::vector<char> chosen(static_cast<size_t>(T), 0);
  int64_t n = 0;
  for (int64_t p = 0; p < T; ++p) {
    if (uniform01(rng) < mask_prob && !special(p)) {  // one draw per position whatever the token
      chosen[static_cast<size_t>(p)] = 1;
      ++n;
    }
  }
  // A sample with no target would contribute nothing (and 0/0 to a per-sample mean): choose
  // one position, the next one that is not special from a random start.
  if (n == 0 && T > 0) {
    const auto start = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(T)));
    for (int64_t k = 0; k < T; ++k) {
      const int64_t p = (start + k) % T;
      if (!special(p)) {
        chosen[static_cast<size_t>(p)] = 1;
        n = 1;
        break;
      }
    }
  }
  for (int64_t p = 0; p < T; ++p) {
    if (!chosen[static_cast<size_t>(p)]) {
      target[p] = -100;
      continue;
    }
    target[p] = input[p];
    const double r = uniform01(rng);
    if (r < 0.8) {
      input[p] = mask_token;
    } else if (r < 0.9) {
      input[p] = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(random_vocab)));
    }  // else unchanged: the model must also predict tokens it can see
  }
  return n;
}

TokenRules::TokenRules(uint64_t seed, int64_t vocab_) : vocab(vocab_) {
  std::mt19937_64 rng(mix_seed({seed, kStreamRules}));
  const auto v = static_cast<uint64_t>(vocab);
  for (int r = 0; r < 4; ++r) {
    a[r] = v > 1 ? 1 + static_cast<int64_t>(bounded(rng, v - 1)) : 1;  // a != 0: no constant sequences
    b[r] = static_cast<int64_t>(bounded(rng, v));
  }
}

void TokenRules::sample(int64_t* out, int64_t len, uint64_t seed, uint64_t stream, int64_t index) const {
  std::mt19937_64 rng(mix_seed({seed, stream, static_cast<uint64_t>(index)}));
  const auto r = static_cast<int>(bounded(rng, 4));
  int64_t t = static_cast<int64_t>(bounded(rng, static_cast<uint64_t>(vocab)));
  for (int64_t i = 0; i < len; ++i) {
    out[i] = t;
    // a, t < vocab <= 2^31 in any sane config; __int128 keeps it exact regardless.
    t = static_cast<int64_t>((static_cast<__int128>(a[r]) * t + b[r]) % vocab);
  }
}

ImageTemplates::ImageTemplates(uint64_t seed, int64_t channels_, int64_t size_, int64_t classes_)
    : channels(channels_), size(size_), classes(classes_), grid(std::min<int64_t>(4, size_)) {
  std::mt19937_64 rng(mix_seed({seed, kStreamTemplates}));
  weights.resize(static_cast<size_t>(classes * channels * grid * grid));
  for (size_t i = 0; i < weights.size(); i += 2) {
    double x, y;
    normal_pair(rng, x, y);
    weights[i] = x;
    if (i + 1 < weights.size()) weights[i + 1] = y;
  }
}

int64_t ImageTemplates::sample(float* out, uint64_t seed, uint64_t stream, int64_t index) const {
  std::mt19937_64 rng(mix_seed({seed, stream, static_cast<uint64_t>(index)}));
  const int64_t n = channels * size * size;
  for (int64_t i = 0; i < n; i += 2) {
    double x, y;
    normal_pair(rng, x, y);
    out[i] = static_cast<float>(x);
    if (i + 1 < n) out[i + 1] = static_cast<float>(y);
  }
  // Average-pool to grid x grid per channel (cell boundaries i*size/grid).
  const int64_t F = channels * grid * grid;
  std::vector<double> feat(static_cast<size_t>(F), 0.0);
  for (int64_t c = 0; c < channels; ++c) {
    for (int64_t gy = 0; gy < grid; ++gy) {
      const int64_t y0 = gy * size / grid, y1 = (gy + 1) * size / grid;
      for (int64_t gx = 0; gx < grid; ++gx) {
        const int64_t x0 = gx * size / grid, x1 = (gx + 1) * size / grid;
        double s = 0.0;
        for (int64_t y = y0; y < y1; ++y)
          for (int64_t x = x0; x < x1; ++x) s += out[(c * size + y) * size + x];
        feat[static_cast<size_t>((c * grid + gy) * grid + gx)] = s / static_cast<double>((y1 - y0) * (x1 - x0));
      }
    }
  }
  int64_t best = 0;
  double best_score = 0.0;
  for (int64_t k = 0; k < classes; ++k) {
    const double* w = weights.data() + k * F;
    double s = 0.0;
    for (int64_t f = 0; f < F; ++f) s += w[f] * feat[static_cast<size_t>(f)];
    if (k == 0 || s > best_score) {
      best = k;
      best_score = s;
    }
  }
  return best;
}

}  // namespace lt::data::detail
