#include "leantrain/checkpoint_io/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lt::checkpoint_io {
namespace {

#if defined(__x86_64__)
// Note [CRC-32 by folding]
// "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction" (Gopal, Ozturk
// et al., Intel, 2009), in the bit-reflected domain of zlib's polynomial 0xEDB88320, as
// Chromium's zlib does it (crc32_sse42_simd_): four 128-bit lanes fold 64 bytes per round,
// then fold into one lane, 16 bytes per round, then 128 -> 64 bits and a Barrett reduction
// to 32. `crc` is the inverted running CRC (zlib's register); `len` >= 64 and a multiple of
// 16. The constants are the paper's k1..k5, P(x)' and mu for that polynomial.
__attribute__((target("pclmul,sse4.1"))) inline __m128i load(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

/// One fold of lane x by the constant pair k, absorbing `next`.
__attribute__((target("pclmul,sse4.1"))) inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x11), next), _mm_clmulepi64_si128(x, k, 0x00));
}

__attribute__((target("pclmul,sse4.1"))) uint32_t fold_pclmul(const unsigned char* buf, size_t len, uint32_t crc) {
  alignas(16) static const uint64_t k1k2[] = {0x0154442bd4, 0x01c6e41596};
  alignas(16) static const uint64_t k3k4[] = {0x01751997d0, 0x00ccaa009e};
  alignas(16) static const uint64_t k5k0[] = {0x0163cd6124, 0x0000000000};
  alignas(16) static const uint64_t poly[] = {0x01db710641, 0x01f7011641};
  __m128i x1 = _mm_xor_si128(load(buf), _mm_cvtsi32_si128(static_cast<int>(crc)));
  __m128i x2 = load(buf + 16), x3 = load(buf + 32), x4 = load(buf + 48);
  __m128i k = _mm_load_si128(reinterpret_cast<const __m128i*>(k1k2));
  buf += 64;
  len -= 64;
  for (; len >= 64; buf += 64, len -= 64) {
    x1 = fold(x1, k, load(buf));
    x2 = fold(x2, k, load(buf + 16));
    x3 = fold(x3, k, load(buf + 32));
    x4 = fold(x4, k, load(buf + 48));
  }
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(k3k4));
  x1 = fold(x1, k, x2);
  x1 = fold(x1, k, x3);
  x1 = fold(x1, k, x4);
  for (; len >= 16; buf += 16, len -= 16) x1 = fold(x1, k, load(buf));
  // 128 -> 64 bits.
  const __m128i mask32 = _mm_setr_epi32(~0, 0, ~0, 0);
  x1 = _mm_xor_si128(_mm_srli_si128(x1, 8), _mm_clmulepi64_si128(x1, k, 0x10));
  k = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(k5k0));
  x1 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x00), _mm_srli_si128(x1, 4));
  // Barrett reduction to 32 bits.
  k = _mm_load_si128(reinterpret_cast<const __m128i*>(poly));
  __m128i x2b = _mm_clmulepi64_si128(_mm_and_si128(x1, mask32), k, 0x10);
  x2b = _mm_clmulepi64_si128(_mm_and_si128(x2b, mask32), k, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x1, x2b), 1));
}

bool have_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

}  // namespace

uint32_t crc32(const void* data, size_t size, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
#if defined(__x86_64__)
  if (size >= 64 && have_pclmul()) {
    const size_t bulk = size & ~static_cast<size_t>(15);
    crc = ~fold_pclmul(p, bulk, ~crc);
    p += bulk;
    size -= bulk;
  }
#endif
  return static_cast<uint32_t>(crc32_z(crc, p, static_cast<z_size_t>(size)));
}

}  // namespace lt::checkpoint_io
